package fleet

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/throttler/throttler/internal/testenv"
)

// TestLocalCluster runs deploy/local/cluster.sh as docs/OPERATIONS.md
// shows it: three NATS nodes, a Redis master with a replica and three
// sentinels, three instances and the sink, on ports from a random base. It
// kills the lane's stream leader and the Redis master mid-drain; every job
// arrives, the sentinels promote the replica, the node rejoins, and
// everything the script started stops.
//
// A cluster test, so in this package (make test-fleet) rather than beside
// TestLocalFleet at the module's root; outcomes only, in the parallel
// phase. The script changes to the module's root itself.
func TestLocalCluster(t *testing.T) {
	t.Parallel()
	for _, tool := range []string{"redis-server", "redis-sentinel", "redis-cli", "curl"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("deploy/local/cluster.sh needs %s on PATH (apt-get install redis-server redis-sentinel curl)", tool)
		}
	}
	bin := testenv.LocalBin(t)
	var out string
	var base int
	for attempt := 0; ; attempt++ {
		// Bases 20000–31000 (ports up to 31900) stay below Linux's
		// ephemeral range (32768 and up), where every other test's free
		// ports and outgoing connections land: a port the script found
		// free was once taken by one of those before nats-server bound it.
		base = 20000 + 1000*int(time.Now().UnixNano()%12)
		env := []string{"CLUSTER_BIN=" + bin, "CLUSTER_PREBUILT=1", fmt.Sprintf("CLUSTER_BASE=%d", base)}
		for _, kv := range os.Environ() {
			if !strings.HasPrefix(kv, "THROTTLER_") && !strings.HasPrefix(kv, "CLUSTER_") {
				env = append(env, kv)
			}
		}
		ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
		cmd := exec.CommandContext(ctx, "../../deploy/local/cluster.sh")
		cmd.Env = env
		cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
		cmd.WaitDelay = 30 * time.Second
		begin := time.Now()
		raw, err := cmd.CombinedOutput()
		cancel()
		out = string(raw)
		if err != nil && strings.Contains(out, "is in use: choose another CLUSTER_BASE") && attempt < 3 {
			continue
		}
		if err != nil {
			t.Fatalf("cluster.sh: %v\n%s", err, out)
		}
		t.Logf("cluster.sh took %v:\n%s", time.Since(begin).Round(100*time.Millisecond), out)
		break
	}
	for _, re := range []string{
		`cluster: sent 90 jobs, 30 to each instance: all accepted`,
		`cluster: killed \(SIGKILL\) nats-[123], the leader of the lane's stream, and the Redis master, after \d+ arrivals`,
		`cluster: the sink received all 90 jobs in (\d+) arrivals`,
		fmt.Sprintf(`cluster: the sentinels promoted 127\.0\.0\.1:%d `, base+380),
		`cluster: nats-[123] restarted and caught up`,
	} {
		if !regexp.MustCompile(re).MatchString(out) {
			t.Errorf("cluster.sh printed no line matching %q", re)
		}
	}
	if m := regexp.MustCompile(`received all 90 jobs in (\d+) arrivals`).FindStringSubmatch(out); m != nil {
		// A job in flight when the leader died may come twice: at most
		// max_inflight (16) per instance.
		if n, _ := strconv.Atoi(m[1]); n > 90+3*16 {
			t.Errorf("%d arrivals for 90 jobs", n)
		}
	}
	if !strings.HasSuffix(out, "cluster: stopped\n") {
		t.Errorf("the output does not end with the stop")
	}
	for _, off := range []int{81, 82, 83, 222, 223, 224, 622, 623, 624, 822, 823, 824, 379, 380, 501, 502, 503, 900} {
		if c, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", base+off), time.Second); err == nil {
			c.Close()
			t.Errorf("port %d still answers after cluster.sh ended", base+off)
		}
	}
}
