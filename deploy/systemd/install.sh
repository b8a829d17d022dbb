#!/usr/bin/env bash
# Installs the binaries and the systemd units on this machine (run as root
# after deploy/setup.sh), then: systemctl enable --now ddp-coordinator
#                          or: systemctl enable --now ddp-worker@0 ddp-worker@1 ...
# Both daemons run as the ddp system user. Put TLS certificates, keys and
# tokens in /etc/ddp as root:ddp, mode 0640 (the folder is root:ddp 0750:
# the daemons read it, ddp-validate, as nobody, can't). Job data goes under
# /var/lib/ddp/data (readable by ddp and nobody), outputs and checkpoints
# under /var/lib/ddp/output and /var/lib/ddp/checkpoints.
set -euo pipefail
cd "$(dirname "$0")/../.."
install -m 0755 build/bin/ddp-coordinator build/bin/ddp-validate build/bin/ddp-worker build/bin/ddp-pack \
  build/bin/ddp-run /usr/local/bin/
if ! getent passwd ddp >/dev/null; then
  useradd --system --user-group --no-create-home --home-dir /nonexistent \
    --shell /usr/sbin/nologin --comment "ddp coordinator and workers" ddp
fi
install -d -m 0750 -o root -g ddp /etc/ddp
install -d -m 0755 /var/lib/ddp /var/lib/ddp/data
install -d -m 0750 -o ddp -g ddp /var/lib/ddp/output /var/lib/ddp/checkpoints
# Files put in /etc/ddp before the ddp user existed.
find /etc/ddp -mindepth 1 -maxdepth 1 -type f ! -group ddp -exec chgrp ddp {} + -exec chmod g+r,o-rwx {} +
install -m 0644 deploy/systemd/ddp-coordinator.service deploy/systemd/ddp-worker@.service \
  /etc/systemd/system/
[ -e /etc/default/ddp-coordinator ] || install -m 0644 deploy/systemd/ddp-coordinator.env /etc/default/ddp-coordinator
[ -e /etc/default/ddp-worker ] || install -m 0644 deploy/systemd/ddp-worker.env /etc/default/ddp-worker
install -D -m 0644 README.md /usr/local/share/doc/ddp/README.md
systemctl daemon-reload
