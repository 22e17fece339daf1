# shellcheck shell=bash
# The process helpers of deploy/local/fleet.sh and deploy/local/cluster.sh,
# sourced by both after they set `prefix` (the word that starts their
# messages), `bin` (where the binaries go) and `prebuilt` (non-empty: the
# binaries in bin are used unbuilt). Not a script of its own.
#
# Every background process gets a process group of its own (set -m), so that
# Ctrl-C reaches the script only and each process is stopped once, in order.
set -m

say() { echo "$prefix: $*"; }
fail() {
	echo "$prefix: $*" >&2
	exit 1
}

# need_tools HINT TOOL…: fails unless every TOOL is on PATH; HINT says how
# to install them.
need_tools() {
	local hint=$1 tool
	shift
	for tool in "$@"; do
		command -v "$tool" >/dev/null || fail "$tool is not on PATH ($hint)"
	done
}

# port_in_use PORT: true when something on 127.0.0.1 answers on PORT.
port_in_use() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# build_binaries: throttler and nats-server (the version in go.mod) into
# $bin; with prebuilt set, checks that both are there instead.
build_binaries() {
	if [[ -n ${prebuilt:-} ]]; then
		local tool
		for tool in throttler nats-server; do
			[[ -x $bin/$tool ]] || fail "$bin/$tool is missing or not executable (the binaries are said to be prebuilt)"
		done
		say "using the prebuilt $bin/throttler and $bin/nats-server"
		return
	fi
	say "building $bin/throttler and $bin/nats-server (the first build takes a minute)"
	mkdir -p "$bin"
	go build -o "$bin/" ./cmd/throttler github.com/nats-io/nats-server/v2
}

# begin_processes: makes the temporary directory tmp, which holds the
# processes' data and logs, and sets the traps that stop every process
# started with start (in the reverse order) and remove tmp when the script
# ends; on a failure the last lines of each log are shown first.
begin_processes() {
	tmp=$(mktemp -d "${TMPDIR:-/tmp}/throttler-$prefix.XXXXXX")
	pids=()
	kinds=()
	trap stop_all EXIT
	trap 'exit 130' INT TERM
}

stop_all() {
	local status=$?
	trap - EXIT INT TERM
	# The reverse of the start: the instances first (each finishes its
	# in-flight jobs and hands the rest back), then what they use. Processes
	# of one kind started one after another (the instances, the NATS nodes,
	# the sentinels) stop together: each is told, then each is waited for,
	# so that their stops overlap. An empty pid is a process the script
	# stopped itself.
	local i=$((${#pids[@]} - 1)) j group
	while ((i >= 0)); do
		group=()
		for ((j = i; j >= 0; j--)); do
			[[ ${kinds[j]} == "${kinds[i]}" ]] || break
			[[ -z ${pids[j]} ]] || group+=("${pids[j]}")
		done
		i=$j
		((${#group[@]} > 0)) || continue
		kill -TERM "${group[@]}" 2>/dev/null || true
		for j in "${group[@]}"; do
			wait "$j" 2>/dev/null || true
		done
	done
	if [[ $status -ne 0 && $status -ne 130 ]]; then # 130: Ctrl-C
		for log in "$tmp"/*.log; do
			[[ -f $log ]] || continue
			echo "--- last lines of $(basename "$log"):" >&2
			tail -n 15 "$log" >&2
		done
	fi
	rm -rf "$tmp"
	say "stopped"
	exit "$status"
}

# start NAME LOG READY CMD…: runs CMD in the background with its output
# appended to LOG and waits until LOG holds the line READY (in what CMD
# wrote, so that a restart appends to the same log); the pid goes to the
# variable last_pid and to pids, its kind (NAME up to a space or a "-N"
# suffix: "throttler", "nats", "sentinel") to kinds.
start() {
	launch "$@"
	await_started
}

# launch NAME LOG READY CMD…: start without the wait; await_started waits
# for every process launched since the last wait, so that processes that
# do not need each other to start (the NATS nodes, the sentinels) start
# side by side.
launching=()
launch() {
	local name=$1 log=$2 ready=$3
	shift 3
	local before=0
	[[ -f $log ]] && before=$(wc -l <"$log")
	: >>"$log"
	"$@" >>"$log" 2>&1 &
	last_pid=$!
	pids+=("$last_pid")
	local kind=${name%% *}
	kinds+=("${kind%-[0-9]*}")
	launching+=("$last_pid" "$name" "$log" "$before" "$ready")
}

# await_started: see launch; fails when one of them exits or is not ready
# within 30 s.
await_started() {
	local i k
	for ((i = 0; i < 300; i++)); do
		local waiting=()
		for ((k = 0; k < ${#launching[@]}; k += 5)); do
			local pid=${launching[k]} name=${launching[k + 1]} log=${launching[k + 2]} before=${launching[k + 3]} ready=${launching[k + 4]}
			tail -n +"$((before + 1))" "$log" | grep -q "$ready" && continue
			kill -0 "$pid" 2>/dev/null || fail "$name exited at start"
			waiting+=("$pid" "$name" "$log" "$before" "$ready")
		done
		launching=(${waiting[@]+"${waiting[@]}"})
		((${#launching[@]} > 0)) || return 0
		sleep 0.1
	done
	fail "${launching[1]} did not start within 30 s"
}

# until_true SECONDS WHAT CMD…: retries CMD every 0.1 s until it succeeds.
until_true() {
	local limit=$1 what=$2 i
	shift 2
	for ((i = 0; i < limit * 10; i++)); do
		"$@" >/dev/null 2>&1 && return 0
		sleep 0.1
	done
	fail "$what: not within $limit s"
}
