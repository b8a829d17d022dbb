#!/usr/bin/env bash
# Run here (Debian 12, with its archive reachable): downloads the Debian
# packages the build needs beyond the GPU machine's image (CUDA PyTorch's
# LibTorch and NCCL are there; gRPC, Protobuf, Abseil, Gloo, GoogleTest and
# the rest are not) into .gpu-pack/, to be carried there:
#   tests/gpu/pack.sh
#   device run, carry [".gpu-pack"]: tests/gpu/device_check.sh "$OUT"
# The folder is ignored by git; at most ~50 MiB (the carry limit is 64 MiB
# with the working tree).
set -euo pipefail
cd "$(dirname "$0")/../.."
out=.gpu-pack
limit_mib=${DDP_PACK_LIMIT_MIB:-50}

# What the build finds (CMakeLists.txt's find_package/pkg_check_modules)
# and the tools that generate code.
wanted=(
  libgrpc++-dev libgrpc-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libprotoc-dev libabsl-dev libgloo-dev libgtest-dev libgmock-dev prometheus-cpp-dev
  libmicrohttpd-dev libgnutls28-dev libseccomp-dev libssl-dev zlib1g-dev pkgconf
)
# What any glibc machine that runs CUDA PyTorch already has, or what the
# build never loads (maintainer scripts' tools). Everything else in the
# packages' dependency closure is taken.
base='^(libc6|libc-bin|libgcc-s1|libstdc\+\+6|gcc-[0-9]+-base|zlib1g|libssl3|libzstd1|liblzma5|libbz2-1\.0|debconf|cdebconf|dpkg|tar|passwd|adduser|perl-base|libpam.*|libselinux1|libaudit.*|libcap-ng0|libcrypt1|libdb5\.3|libreadline8|readline-common|libnewt0\.52|libslang2|libtextwrap1|libtinfo6|libacl1|libpcre2-8-0|libmd0|install-info|libdebian-installer4|libsemanage.*|libsepol2|libc6-dev|libc-dev-bin|linux-libc-dev|libcrypt-dev|libnsl-dev|libtirpc.*|rpcsvc-proto|libgssapi-krb5-2|libkrb5.*|libk5crypto3|libkeyutils1|libcom-err2|libstdc\+\+-[0-9]+-dev|libgcc-[0-9]+-dev|gcc-.*|cpp-.*|g\+\+.*|libgomp1|libitm1|libatomic1|libasan.*|liblsan0|libtsan.*|libubsan1|libquadmath0|libcc1-0|binutils.*|libbinutils|libctf.*|libgprofng0|libjansson4|libisl23|libmpc3|libmpfr6|libgmp10|libsframe1|libexpat1|mime-support|media-types|tzdata|sensible-utils|coreutils|libsystemd0|libudev1|liblz4-1|libgpg-error0|libgcrypt20|libcap2|perl|perl-modules.*|libperl.*|libgdbm.*|python3.*|libpython3.*)$'

deps=$(apt-cache depends --recurse --no-recommends --no-suggests --no-conflicts --no-breaks \
         --no-replaces --no-enhances "${wanted[@]}" | grep -v '^ ' | grep -v '^<' | sort -u)
take=()
for p in $deps; do
  [[ $p =~ $base ]] || take+=("$p")
done
rm -rf "$out.tmp" && mkdir -p "$out.tmp"
# Exit 3: the archive could not be reached (the configure test then skips).
(cd "$out.tmp" && apt-get download -q "${take[@]}" >/dev/null) || {
  echo "pack: apt-get download failed (is the Debian archive reachable? apt-get update run?)" >&2
  exit 3
}
printf '%s\n' "${take[@]}" >"$out.tmp/PACKAGES"
size=$(du -sm "$out.tmp" | cut -f1)
if ((size > limit_mib)); then
  echo "pack: ${size} MiB is over ${limit_mib} MiB; the largest:" >&2
  ls -S "$out.tmp" | head -5 >&2
  exit 1
fi
rm -rf "$out" && mv "$out.tmp" "$out"
echo "pack: ${#take[@]} packages, ${size} MiB in $out/"
