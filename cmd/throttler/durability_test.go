package main

import (
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/throttler/throttler/internal/testenv"
)

// TestKill9MidDrainLosesNothing: 500 jobs queued, the instance is killed
// with SIGKILL mid-drain and started again: every accepted job is
// delivered; only jobs in flight at the kill may come twice, with their id.
func TestKill9MidDrainLosesNothing(t *testing.T) {
	t.Parallel()
	nats := testenv.StartNATS(t)
	redis := testenv.StartRedis(t)
	target := newArrivals(t)
	dir := t.TempDir()
	const maxInflight = 8
	path, addr := procConfig(t, dir, nats.ClientURL(), redis.URL(), laneYAML{rate: 100, burst: 10, maxInflight: maxInflight, target: target.srv.URL})
	p := startProc(t, path, addr)
	client := &http.Client{Timeout: 5 * time.Second}
	defer client.CloseIdleConnections()
	for i := 0; i < 500; i++ {
		if code := post(client, addr, fmt.Sprintf("k9-%03d", i)); code != http.StatusAccepted {
			t.Fatalf("job %d: status %d", i, code)
		}
	}
	poll(t, 10*time.Second, "150 deliveries", func() bool { return target.count() >= 150 })
	p.kill9()
	before := target.count()
	startProc(t, path, addr)
	poll(t, 30*time.Second, "every job delivered after the restart", func() bool { return len(target.perID()) == 500 })
	settled(t, addr)
	dups := 0
	for id, n := range target.perID() {
		if n > 1 {
			dups += n - 1
			t.Logf("job %s delivered %d times", id, n)
		}
	}
	// In flight at the kill: at most max_inflight dispatches plus the slots
	// held ahead of them.
	if dups > 2*maxInflight {
		t.Fatalf("%d duplicate deliveries, more than could have been in flight (%d)", dups, 2*maxInflight)
	}
	t.Logf("%d delivered before the kill, %d duplicates after the restart", before, dups)
}

// TestNATSRestartMidDrain restarts a standalone nats-server (file store) in
// the middle of a drain: intake answers 503 while it is away, the throttler
// reconnects by itself, and nothing accepted is lost.
func TestNATSRestartMidDrain(t *testing.T) {
	t.Parallel()
	natsDir := t.TempDir()
	port := freePortNum(t)
	srv := testenv.StartNATSDir(t, natsDir, port)
	url := srv.ClientURL()
	redis := testenv.StartRedis(t)
	target := newArrivals(t)
	path, addr := procConfig(t, t.TempDir(), url, redis.URL(), laneYAML{rate: 50, burst: 5, target: target.srv.URL})
	startProc(t, path, addr)
	client := &http.Client{Timeout: 5 * time.Second}
	defer client.CloseIdleConnections()
	accepted := map[string]bool{}
	for i := 0; i < 200; i++ {
		id := fmt.Sprintf("nr-%03d", i)
		if code := post(client, addr, id); code != http.StatusAccepted {
			t.Fatalf("job %d: status %d", i, code)
		}
		accepted[id] = true
	}
	poll(t, 10*time.Second, "50 deliveries", func() bool { return target.count() >= 50 })
	srv.Shutdown()
	srv.WaitForShutdown()
	// While NATS is away, nothing is accepted that was not stored.
	for i := 0; i < 5; i++ {
		id := fmt.Sprintf("nr-down-%d", i)
		t0 := time.Now()
		code := post(client, addr, id)
		t.Logf("submission during outage: %d after %v", code, time.Since(t0))
		switch code {
		case http.StatusAccepted:
			accepted[id] = true // stored before the connection noticed
		case http.StatusServiceUnavailable:
		default:
			t.Fatalf("submission while NATS is away: status %d, want 503", code)
		}
	}
	// The instance knows NATS is away: /readyz fails (a load balancer
	// takes it out), while /healthz says the process is alive.
	poll(t, 10*time.Second, "/readyz to fail while NATS is away", func() bool { return getStatus(client, addr, "/readyz") == http.StatusServiceUnavailable })
	if code := getStatus(client, addr, "/healthz"); code != http.StatusOK {
		t.Fatalf("/healthz %d while NATS is away", code)
	}
	testenv.StartNATSDir(t, natsDir, port)
	poll(t, 20*time.Second, "/readyz to pass again", func() bool { return getStatus(client, addr, "/readyz") == http.StatusOK })
	poll(t, 20*time.Second, "intake to work again", func() bool { return post(client, addr, "nr-after") == http.StatusAccepted })
	accepted["nr-after"] = true
	poll(t, 30*time.Second, "every accepted job delivered", func() bool {
		got := target.perID()
		for id := range accepted {
			if got[id] == 0 {
				return false
			}
		}
		return true
	})
}

func freePortNum(t *testing.T) int {
	var port int
	fmt.Sscanf(freePort(t)[len("127.0.0.1:"):], "%d", &port)
	return port
}

// getStatus returns the status of GET path (0 on a transport error).
func getStatus(client *http.Client, addr, path string) int {
	resp, err := client.Get("http://" + addr + path)
	if err != nil {
		return 0
	}
	resp.Body.Close()
	return resp.StatusCode
}
