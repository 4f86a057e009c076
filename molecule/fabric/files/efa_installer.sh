#!/bin/sh
# Stands for AWS's efa_installer.sh, which needs an EFA device and AWS's packages: records how
# it was run, and puts a plugin library where the real installer puts aws-ofi-nccl, so the
# role's dynamic linker file is proven to reach it.
set -eu
mkdir -p /var/lib/efa-stand-in /opt/amazon/efa/lib /opt/amazon/ofi-nccl/lib/x86_64-linux-gnu
echo "$*" >> /var/lib/efa-stand-in/calls
cp libnccl-net-ofi.so /opt/amazon/ofi-nccl/lib/x86_64-linux-gnu/libnccl-net-ofi.so
