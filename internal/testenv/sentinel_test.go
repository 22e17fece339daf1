package testenv_test

import (
	"context"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/throttler/throttler/internal/testenv"
)

// TestRedisSentinelFailover kills the master under a go-redis failover
// client built from URL(): the sentinels promote the replica, which holds
// what was written before the kill, and the client writes to it.
func TestRedisSentinelFailover(t *testing.T) {
	t.Parallel()
	start := time.Now()
	s := testenv.StartRedisSentinel(t)
	t.Logf("sentinels ready in %v", time.Since(start).Round(time.Millisecond))
	opt, err := redis.ParseFailoverURL(s.URL())
	if err != nil {
		t.Fatalf("ParseFailoverURL(%q): %v", s.URL(), err)
	}
	if opt.MasterName != s.MasterName() || !slices.Equal(opt.SentinelAddrs, s.SentinelAddrs()) {
		t.Fatalf("URL %q parses to master %q, sentinels %v; want %q, %v", s.URL(), opt.MasterName, opt.SentinelAddrs, s.MasterName(), s.SentinelAddrs())
	}
	c := redis.NewFailoverClient(opt)
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := c.Set(ctx, "k", "before", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if n, err := c.Wait(ctx, 1, time.Second).Result(); err != nil || n != 1 {
		t.Fatalf("WAIT 1: %d %v, want the replica to acknowledge", n, err)
	}

	killed := time.Now()
	old := s.KillMaster(t)
	if conn, err := net.DialTimeout("tcp", old, time.Second); err == nil {
		conn.Close()
		t.Fatal("the old master still accepts connections")
	}
	next := s.WaitFailover(t, old)
	t.Logf("failover from %s to %s in %v", old, next, time.Since(killed).Round(time.Millisecond))
	if next == old || s.MasterAddr(t) != next {
		t.Fatalf("WaitFailover = %s, MasterAddr = %s, old master %s", next, s.MasterAddr(t), old)
	}
	var got string
	for range 100 { // the client learns of the switch on its own schedule
		if got, err = c.Get(ctx, "k").Result(); err == nil {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err != nil || got != "before" {
		t.Fatalf("GET k after the failover: %q %v, want \"before\"", got, err)
	}
	if err := c.Set(ctx, "k", "after", 0).Err(); err != nil {
		t.Fatalf("SET after the failover: %v", err)
	}
}

func TestStartRedisSentinelWithoutBinaryFailsWithInstallHint(t *testing.T) {
	server, err := exec.LookPath("redis-server")
	if err != nil {
		t.Fatalf("redis-server: %v", err)
	}
	// A PATH with redis-server and without redis-sentinel.
	dir := t.TempDir()
	if err := os.Symlink(server, filepath.Join(dir, "redis-server")); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", dir)
	rec := &fatalRecorder{T: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		testenv.StartRedisSentinel(rec)
		t.Error("StartRedisSentinel returned without redis-sentinel on PATH")
	}()
	<-done
	if rec.skipped || !strings.Contains(rec.msg, "apt-get install redis-sentinel") {
		t.Fatalf("failure message %q (skipped %v) does not say how to install redis-sentinel", rec.msg, rec.skipped)
	}
}
