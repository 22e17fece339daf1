#!/usr/bin/env bash
# A local fleet without containers: a nats-server with JetStream (built from
# the version in go.mod), a redis-server, two throttler instances sharing
# them, and `throttler sink` as the lane's target.
#
#   deploy/local/fleet.sh        start everything, send 60 jobs (30 to each
#                                instance), show that both share one limit, stop
#   deploy/local/fleet.sh up     start everything and keep it running until Ctrl-C
#
# Needs go and redis-server on PATH (apt-get install redis-server). Ports can
# be changed with FLEET_HTTP1, FLEET_HTTP2, FLEET_NATS, FLEET_REDIS and
# FLEET_SINK; binaries go to FLEET_BIN (default bin/); with FLEET_PREBUILT=1
# the throttler and nats-server already in FLEET_BIN are used as they are,
# unbuilt (the tests build them once for all). Data lives in a temporary
# directory that is removed at the end.
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
http1=${FLEET_HTTP1:-8081}
http2=${FLEET_HTTP2:-8082}
nats_port=${FLEET_NATS:-4222}
redis_port=${FLEET_REDIS:-6380}
sink_port=${FLEET_SINK:-9000}
bin=${FLEET_BIN:-bin}
prebuilt=${FLEET_PREBUILT:-}
jobs=60

prefix=fleet
# shellcheck source=deploy/local/lib.sh
source "$root/deploy/local/lib.sh"

need_tools "redis-server: apt-get install redis-server" go redis-server curl
for var in FLEET_HTTP1:$http1 FLEET_HTTP2:$http2 FLEET_NATS:$nats_port FLEET_REDIS:$redis_port FLEET_SINK:$sink_port; do
	port=${var#*:}
	if port_in_use "$port"; then
		fail "port $port is in use: choose another with ${var%%:*}=<port>"
	fi
done

build_binaries
begin_processes

cat >"$tmp/nats.conf" <<EOF
listen: 127.0.0.1:$nats_port
max_payload: 2MB   # a lane's max_body (1 MiB) plus the job's headers
jetstream { store_dir: "$tmp/nats" }
EOF
start nats-server "$tmp/nats.log" "Server is ready" "$bin/nats-server" -c "$tmp/nats.conf"
start redis-server "$tmp/redis.log" "Ready to accept connections" \
	redis-server --port "$redis_port" --bind 127.0.0.1 --save '' --appendonly no --dir "$tmp"
start sink "$tmp/sink.log" '"sink listening"' "$bin/throttler" sink --listen "127.0.0.1:$sink_port"

# One config for both instances; each gets its own listen address from
# THROTTLER_LISTEN.
cat >"$tmp/throttler.yaml" <<EOF
listen: 127.0.0.1:$http1
shutdown_timeout: 5s
nats:
  url: nats://127.0.0.1:$nats_port
redis:
  url: redis://127.0.0.1:$redis_port/0
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
for port in "$http1" "$http2"; do
	THROTTLER_LISTEN=127.0.0.1:$port start "throttler 127.0.0.1:$port" "$tmp/throttler-$port.log" '"throttler ready"' \
		"$bin/throttler" serve --config "$tmp/throttler.yaml"
done
say "up: throttler on 127.0.0.1:$http1 and 127.0.0.1:$http2, nats://127.0.0.1:$nats_port, redis://127.0.0.1:$redis_port, sink on 127.0.0.1:$sink_port"

if [[ $mode == up ]]; then
	say "logs in $tmp; try: curl -s -X POST -d '{}' localhost:$http1/v1/lanes/demo/jobs"
	say "Ctrl-C stops everything"
	# Until Ctrl-C, or until one of the processes ends.
	wait -n || true
	fail "a process ended; see the logs above"
fi

# The demo: half of the jobs to each instance, all at once.
half=$((jobs / 2))
send() {
	curl --no-progress-meter --parallel --parallel-max "$half" -X POST -H 'Content-Type: application/json' \
		-d '{"hello":"fleet"}' "http://127.0.0.1:$1/v1/lanes/demo/jobs?n=[1-$half]"
}
began=$(date +%s.%N)
send "$http1" >"$tmp/answers-$http1" &
s1=$!
send "$http2" >"$tmp/answers-$http2" &
s2=$!
wait "$s1" "$s2"
took=$(awk -v a="$began" -v b="$(date +%s.%N)" 'BEGIN { printf "%.2f", b - a }')
say "sent $jobs jobs at once, $half to each instance, in $took s"
a1=$(grep -c '"state":"admitted"' "$tmp/answers-$http1" || true)
a2=$(grep -c '"state":"admitted"' "$tmp/answers-$http2" || true)
answered=$(cat "$tmp/answers-$http1" "$tmp/answers-$http2" | grep -c '"state":' || true)
[[ $answered -eq $jobs ]] || fail "$answered of $jobs submissions were accepted"
say "admitted $a1 via 127.0.0.1:$http1 + $a2 via 127.0.0.1:$http2 = $((a1 + a2)): one burst of 10 for both, plus a token per 50 ms"

received() { grep -c '"msg":"job received"' "$tmp/sink.log" || true; }
for ((i = 0; i < 300; i++)); do
	[[ $(received) -ge $jobs ]] && break
	sleep 0.1
done
[[ $(received) -eq $jobs ]] || fail "the sink received $(received) of $jobs jobs within 30 s"
# Seconds from the first arrival to the last, from the sink's log.
span=$(grep '"msg":"job received"' "$tmp/sink.log" | sed -n 's/.*"time":"[^T]*T\([0-9:.]*\)Z\{0,1\}[^"]*".*/\1/p' |
	awk -F: '{ t = $1 * 3600 + $2 * 60 + $3; if (NR == 1) first = t; last = t } END { printf "%.1f", last - first }')
say "the sink received $jobs jobs in $span s: the burst, then 20/s; two separate limits would have taken $(awk -v n=$jobs 'BEGIN { printf "%.1f", (n - 20) / 40 }') s"

delivered() { curl -s "http://127.0.0.1:$1/v1/lanes" | grep -o '"delivered":[0-9]*' | cut -d: -f2; }
say "delivered by 127.0.0.1:$http1: $(delivered "$http1"), by 127.0.0.1:$http2: $(delivered "$http2")"
