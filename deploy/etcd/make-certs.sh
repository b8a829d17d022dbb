#!/usr/bin/env bash
# What a TLS etcd for the coordinators needs, made with openssl in DIR:
#   ca.pem, ca-key.pem          the CA etcd and the coordinators trust
#   server.pem, server-key.pem  each etcd member's certificate, valid for
#                               the names and addresses given
#   ddp.pem, ddp-key.pem        the coordinators' client certificate; its
#                               CN is "ddp", the etcd user etcd's
#                               --client-cert-auth takes it for
#   root.pem, root-key.pem      etcd's root user, for etcdctl (set up the
#                               users and roles, docs/SECURITY.md "etcd")
#
#   deploy/etcd/make-certs.sh DIR NAME_OR_IP[,NAME_OR_IP...]
#
# Then each member (docs/SECURITY.md "etcd" has the whole line):
#   etcd --cert-file=DIR/server.pem --key-file=DIR/server-key.pem \
#        --client-cert-auth --trusted-ca-file=DIR/ca.pem \
#        --listen-client-urls=https://IP:2379 --advertise-client-urls=https://IP:2379 ...
# and each coordinator:
#   ddp-coordinator --etcd_endpoints=IP:2379 --etcd_tls_ca=DIR/ca.pem \
#        --etcd_tls_cert=DIR/ddp.pem --etcd_tls_key=DIR/ddp-key.pem ...
set -euo pipefail
if [[ $# -ne 2 ]]; then
  echo "usage: $0 DIR NAME_OR_IP[,NAME_OR_IP...]" >&2
  exit 2
fi
dir=$1
names=$2
mkdir -p "$dir"
chmod 700 "$dir"
cd "$dir"
umask 077
san=""
IFS=',' read -ra list <<<"$names"
for n in "${list[@]}"; do
  if [[ $n =~ ^[0-9.]+$ || $n == *:* ]]; then san+="IP:$n,"; else san+="DNS:$n,"; fi
done
san=${san%,}
days=825
openssl req -x509 -newkey rsa:2048 -nodes -keyout ca-key.pem -out ca.pem -days "$days" \
  -subj "/CN=ddp etcd CA" 2>/dev/null
# One certificate signed by the CA: NAME, CN, extended key usage, SANs.
issue() {
  local name=$1 cn=$2 usage=$3 extra=${4:-}
  openssl req -newkey rsa:2048 -nodes -keyout "$name-key.pem" -out "$name.csr" \
    -subj "/CN=$cn" 2>/dev/null
  printf 'extendedKeyUsage=%s\n%s' "$usage" "$extra" >"$name.ext"
  openssl x509 -req -in "$name.csr" -CA ca.pem -CAkey ca-key.pem -CAcreateserial \
    -out "$name.pem" -days "$days" -extfile "$name.ext" 2>/dev/null
  rm -f "$name.csr" "$name.ext"
}
issue server "ddp etcd member" serverAuth,clientAuth "subjectAltName=$san"$'\n'
issue ddp ddp clientAuth
issue root root clientAuth
rm -f ca.srl
echo "made in $dir: ca.pem, server.pem (for $names), ddp.pem (etcd user ddp), root.pem"
