#!/usr/bin/env bash
# Live failover on the scenario's heads, from the workstation: the etcd leader stopped (how
# long until a write succeeds on another member), the head holding the API's virtual address
# stopped (how long until another holds it), and that head's haproxy stopped. Prints figures;
# exits non-zero on the first thing that does not happen.
set -euo pipefail
HEADS=(mol-k8s-h1 mol-k8s-h2 mol-k8s-h3)
VIP=10.89.18.10
ETCD=(env ETCDCTL_API=3 ETCDCTL_CACERT=/etc/etcd/pki/ca.crt ETCDCTL_CERT=/etc/etcd/pki/member.crt
      ETCDCTL_KEY=/etc/etcd/pki/member.key ETCDCTL_ENDPOINTS=https://127.0.0.1:2379)
ms() { date +%s%3N; }
on() { local h=$1; shift; podman exec "$h" "$@"; }
until_ok() {  # until_ok SECONDS CMD...: retry every 50 ms
  local end=$(( $(date +%s) + $1 )); shift
  until "$@" >/dev/null 2>&1; do
    (( $(date +%s) < end )) || { echo "timed out: $*"; return 1; }
    sleep 0.05
  done
}
holds_vip() { on "$1" ip -4 -o addr show | grep -q " $VIP/"; }
vip_holder() { for h in "${HEADS[@]}"; do holds_vip "$h" && { echo "$h"; return 0; }; done; return 1; }
api_port_answers() { timeout 2 bash -c "</dev/tcp/$VIP/8443"; }
moved_from() { local h; h=$(vip_holder) && [[ $h != "$1" ]]; }

# --- etcd: stop the leader, write through another member
leader=""
for h in "${HEADS[@]}"; do
  if on "$h" "${ETCD[@]}" etcdctl endpoint status -w json | python3 -c \
      'import json,sys; s=json.load(sys.stdin)[0]["Status"]; sys.exit(s["leader"]!=s["header"]["member_id"])'
  then leader=$h; fi
done
[[ -n $leader ]] || { echo "no etcd member says it leads"; exit 1; }
other=$(printf '%s\n' "${HEADS[@]}" | grep -vx "$leader" | head -1)
on "$other" "${ETCD[@]}" etcdctl put /provision/probe before >/dev/null
t0=$(ms); on "$leader" systemctl stop etcd
until_ok 30 on "$other" "${ETCD[@]}" etcdctl --command-timeout=1s put /provision/probe after
t1=$(ms)
echo "etcd: leader $leader stopped; a write succeeded on $other after $((t1 - t0)) ms"
value=$(on "$other" "${ETCD[@]}" etcdctl get --print-value-only /provision/probe)
[[ $value == after ]] || { echo "etcd: read back '$value'"; exit 1; }
members=$(on "$other" "${ETCD[@]}" etcdctl member list | wc -l)
echo "etcd: $members members listed, 2 of 3 up: quorum kept"
on "$leader" systemctl start etcd
until_ok 60 on "$leader" "${ETCD[@]}" etcdctl endpoint health --cluster
echo "etcd: $leader back, all 3 healthy"

# --- the API's virtual address: stop keepalived on its holder
holder=$(vip_holder) || { echo "no head holds $VIP"; exit 1; }
until_ok 10 api_port_answers
t0=$(ms); on "$holder" systemctl stop keepalived
until_ok 30 moved_from "$holder"
t1=$(ms)
new=$(vip_holder)
echo "vip: keepalived stopped on $holder; $VIP on $new after $((t1 - t0)) ms"
until_ok 10 api_port_answers
echo "vip: $VIP:8443 answers again (haproxy on $new)"
on "$holder" systemctl start keepalived
sleep 4
[[ $(vip_holder) == "$new" ]] || { echo "vip: moved back to $(vip_holder) (nopreempt?)"; exit 1; }
echo "vip: $holder back; the address stays on $new (nopreempt)"

# --- haproxy stopped on the holder: keepalived's check gives the address away
t0=$(ms); on "$new" systemctl stop haproxy
until_ok 30 moved_from "$new"
t1=$(ms)
echo "vip: haproxy stopped on $new; $VIP on $(vip_holder) after $((t1 - t0)) ms"
on "$new" systemctl start haproxy
until_ok 10 api_port_answers
echo "vip: $VIP:8443 answers"
