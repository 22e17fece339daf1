#!/usr/bin/env bash
# The fleet of deploy/compose/cluster.yml without containers: a three-node
# NATS JetStream cluster (nats-server built from the version in go.mod), a
# redis-server master with a replica and three redis-sentinel processes,
# three throttler instances (nats.replicas 3, redis.mode sentinel) and
# `throttler sink` as the lane's target, all on 127.0.0.1.
#
#   deploy/local/cluster.sh      start everything, send 90 jobs (30 to each
#                                instance), kill -9 the NATS node leading the
#                                lane's stream and the Redis master mid-drain,
#                                show that every job arrives, restart the
#                                node, stop
#   deploy/local/cluster.sh up   start everything and keep it running until Ctrl-C
#
# Needs go, curl, redis-server, redis-sentinel and redis-cli on PATH
# (apt-get install redis-server redis-sentinel). Ports are CLUSTER_BASE
# (default 17000) plus: 81-83 the instances' HTTP, 222-224 NATS clients,
# 622-624 NATS routes, 822-824 NATS monitoring, 379 the Redis master, 380
# the replica, 501-503 the sentinels, 900 the sink. Binaries go to
# CLUSTER_BIN (default bin/); with CLUSTER_PREBUILT=1 the throttler and
# nats-server already in CLUSTER_BIN are used as they are, unbuilt (the
# tests build them once for all). Data lives in a temporary directory that
# is removed at the end.
set -euo pipefail

mode=${1:-demo}
case $mode in
demo | up) ;;
*)
	echo "usage: $0 [up]" >&2
	exit 2
	;;
esac

root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
base=${CLUSTER_BASE:-17000}
bin=${CLUSTER_BIN:-bin}
prebuilt=${CLUSTER_PREBUILT:-}
jobs=90
http=($((base + 81)) $((base + 82)) $((base + 83)))
nats_client=($((base + 222)) $((base + 223)) $((base + 224)))
nats_route=($((base + 622)) $((base + 623)) $((base + 624)))
nats_mon=($((base + 822)) $((base + 823)) $((base + 824)))
redis_master=$((base + 379))
redis_replica=$((base + 380))
sentinel=($((base + 501)) $((base + 502)) $((base + 503)))
sink_port=$((base + 900))

prefix=cluster
# shellcheck source=deploy/local/lib.sh
source "$root/deploy/local/lib.sh"

need_tools "apt-get install redis-server redis-sentinel" go curl redis-server redis-sentinel redis-cli
for port in "${http[@]}" "${nats_client[@]}" "${nats_route[@]}" "${nats_mon[@]}" "$redis_master" "$redis_replica" "${sentinel[@]}" "$sink_port"; do
	if port_in_use "$port"; then
		fail "port $port is in use: choose another CLUSTER_BASE"
	fi
done

build_binaries
begin_processes

# NATS: three nodes with routes to each other, JetStream on each.
routes=""
for i in 0 1 2; do routes+="${routes:+, }nats-route://127.0.0.1:${nats_route[i]}"; done
nats_pid=()
start_nats() {
	local i=$1 n=$(($1 + 1))
	if [[ ! -f $tmp/nats-$n.conf ]]; then
		mkdir -p "$tmp/nats-$n"
		cat >"$tmp/nats-$n.conf" <<EOF
server_name: nats-$n
listen: 127.0.0.1:${nats_client[i]}
http: 127.0.0.1:${nats_mon[i]}
max_payload: 2MB
jetstream { store_dir: "$tmp/nats-$n" }
cluster {
  name: throttler
  listen: 127.0.0.1:${nats_route[i]}
  routes: [ $routes ]
}
EOF
	fi
	launch "nats-$n" "$tmp/nats-$n.log" "Server is ready" "$bin/nats-server" -c "$tmp/nats-$n.conf"
	nats_pid[i]=$last_pid
}
nats_healthy() { curl -sf "http://127.0.0.1:${nats_mon[$1]}/healthz" | grep -q '"ok"'; }
for i in 0 1 2; do start_nats "$i"; done
await_started
for i in 0 1 2; do until_true 30 "nats-$((i + 1)) healthy (JetStream meta leader elected)" nats_healthy "$i"; done

# Redis: a master without disk, a replica of it, three sentinels (quorum 2).
start redis-master "$tmp/redis-master.log" "Ready to accept connections" \
	redis-server --port "$redis_master" --bind 127.0.0.1 --save '' --appendonly no --dir "$tmp" --repl-diskless-sync-delay 0
master_pid=$last_pid
start redis-replica "$tmp/redis-replica.log" "Ready to accept connections" \
	redis-server --port "$redis_replica" --bind 127.0.0.1 --save '' --appendonly no --dir "$tmp" --repl-diskless-sync-delay 0 \
	--replicaof 127.0.0.1 "$redis_master"
until_true 30 "the replica in sync" sh -c "redis-cli -p $redis_replica info replication | grep -q master_link_status:up"
for i in 0 1 2; do
	mkdir -p "$tmp/sentinel-$i"
	cat >"$tmp/sentinel-$i/sentinel.conf" <<EOF
port ${sentinel[i]}
bind 127.0.0.1
dir "$tmp/sentinel-$i"
sentinel monitor mymaster 127.0.0.1 $redis_master 2
sentinel down-after-milliseconds mymaster 2000
sentinel failover-timeout mymaster 10000
sentinel parallel-syncs mymaster 1
EOF
	launch "sentinel-$((i + 1))" "$tmp/sentinel-$i.log" "+monitor master" redis-sentinel "$tmp/sentinel-$i/sentinel.conf"
done
await_started
sentinels_ready() {
	local i
	for i in 0 1 2; do
		redis-cli -p "${sentinel[i]}" sentinel master mymaster | tr '\n' ' ' | grep -q "num-other-sentinels 2" || return 1
		redis-cli -p "${sentinel[i]}" sentinel master mymaster | tr '\n' ' ' | grep -q "num-slaves 1" || return 1
	done
}
until_true 30 "the sentinels to know each other and the replica" sentinels_ready

start sink "$tmp/sink.log" '"sink listening"' "$bin/throttler" sink --listen "127.0.0.1:$sink_port"

cat >"$tmp/throttler.yaml" <<EOF
listen: 127.0.0.1:${http[0]}
shutdown_timeout: 5s
nats:
  url: nats://127.0.0.1:${nats_client[0]},nats://127.0.0.1:${nats_client[1]},nats://127.0.0.1:${nats_client[2]}
  replicas: 3
redis:
  url: redis://127.0.0.1:${sentinel[0]}/0?master_name=mymaster&addr=127.0.0.1:${sentinel[1]}&addr=127.0.0.1:${sentinel[2]}
  mode: sentinel
dispatch:
  allow_networks: [127.0.0.0/8]
lanes:
  - name: demo
    rate: 20/s
    burst: 10
    target:
      http:
        url: http://127.0.0.1:$sink_port/hook
EOF
for port in "${http[@]}"; do
	THROTTLER_LISTEN=127.0.0.1:$port start "throttler 127.0.0.1:$port" "$tmp/throttler-$port.log" '"throttler ready"' \
		"$bin/throttler" serve --config "$tmp/throttler.yaml"
done
say "up: throttler on 127.0.0.1:${http[0]}, :${http[1]}, :${http[2]}; NATS nats://127.0.0.1:${nats_client[0]} (+ :${nats_client[1]}, :${nats_client[2]}); Redis master 127.0.0.1:$redis_master, replica :$redis_replica, sentinels :${sentinel[0]} :${sentinel[1]} :${sentinel[2]}; sink 127.0.0.1:$sink_port"

if [[ $mode == up ]]; then
	say "logs in $tmp; try: curl -s -X POST -d '{}' localhost:${http[0]}/v1/lanes/demo/jobs"
	say "Ctrl-C stops everything"
	wait -n || true
	fail "a process ended; see the logs above"
fi

# The demo: a third of the jobs to each instance, all at once.
third=$((jobs / 3))
send() {
	curl --no-progress-meter --parallel --parallel-max "$third" -X POST -H 'Content-Type: application/json' \
		-d '{"hello":"cluster"}' "http://127.0.0.1:$1/v1/lanes/demo/jobs?n=[1-$third]"
}
sends=()
for port in "${http[@]}"; do
	send "$port" >"$tmp/answers-$port" &
	sends+=($!)
done
wait "${sends[@]}"
accepted=$(cat "$tmp"/answers-* | grep -c '"state":' || true)
[[ $accepted -eq $jobs ]] || fail "$accepted of $jobs submissions were accepted"
say "sent $jobs jobs, $third to each instance: all accepted"

received() { grep '"msg":"job received"' "$tmp/sink.log" | grep -o '"id":"[^"]*"' | sort -u | wc -l; }
until_true 30 "the first 30 arrivals" sh -c "[ \$(grep -c '\"msg\":\"job received\"' '$tmp/sink.log') -ge 30 ]"

# The node that leads the lane's stream, from its monitoring endpoint.
leader=$(curl -s "http://127.0.0.1:${nats_mon[0]}/jsz?streams=true" | tr ',{}' '\n\n\n' |
	sed -n '/"name": *"THROTTLE_demo"/,$p' | grep -m1 '"leader"' | cut -d'"' -f4)
[[ $leader =~ ^nats-[123]$ ]] || fail "no leader of stream THROTTLE_demo reported (got '$leader')"
victim=$((${leader#nats-} - 1))
killed_at=$(date +%s.%N)
kill -9 "${nats_pid[victim]}" "$master_pid"
wait "${nats_pid[victim]}" "$master_pid" 2>/dev/null || true
for i in "${!pids[@]}"; do
	if [[ ${pids[i]} == "${nats_pid[victim]}" || ${pids[i]} == "$master_pid" ]]; then pids[i]=""; fi
done
say "killed (SIGKILL) $leader, the leader of the lane's stream, and the Redis master, after $(received) arrivals"

until_true 120 "every job at the sink" sh -c "[ \$(grep '\"msg\":\"job received\"' '$tmp/sink.log' | grep -o '\"id\":\"[^\"]*\"' | sort -u | wc -l) -ge $jobs ]"
took=$(awk -v a="$killed_at" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
say "the sink received all $jobs jobs in $(grep -c '"msg":"job received"' "$tmp/sink.log") arrivals (a job in flight at the kill may come twice), the last $took s after the kill"
new_master=$(redis-cli -p "${sentinel[0]}" sentinel get-master-addr-by-name mymaster | tr '\n' ':' | sed 's/:$//')
say "the sentinels promoted $new_master (the replica was 127.0.0.1:$redis_replica)"

start_nats "$victim"
await_started
until_true 60 "$leader healthy again" nats_healthy "$victim"
say "$leader restarted and caught up"
