#!/usr/bin/env bash
# Installs the binaries and the systemd units on this machine (run as root
# after deploy/setup.sh), then: systemctl enable --now ddp-coordinator
#                          or: systemctl enable --now ddp-worker@0 ddp-worker@1 ...
set -euo pipefail
cd "$(dirname "$0")/../.."
install -m 0755 build/bin/ddp-coordinator build/bin/ddp-validate build/bin/ddp-worker \
  build/bin/ddp-run /usr/local/bin/
install -m 0644 deploy/systemd/ddp-coordinator.service deploy/systemd/ddp-worker@.service \
  /etc/systemd/system/
[ -e /etc/default/ddp-coordinator ] || install -m 0644 deploy/systemd/ddp-coordinator.env /etc/default/ddp-coordinator
[ -e /etc/default/ddp-worker ] || install -m 0644 deploy/systemd/ddp-worker.env /etc/default/ddp-worker
install -D -m 0644 README.md /usr/local/share/doc/ddp/README.md
systemctl daemon-reload
