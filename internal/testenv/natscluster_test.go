package testenv_test

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/throttler/throttler/internal/testenv"
)

// TestNATSClusterKillAndRestart starts a three-node cluster with users,
// kills the leader of an R3 stream, finds the new leader, and brings the
// node back on its ports and store.
func TestNATSClusterKillAndRestart(t *testing.T) {
	t.Parallel()
	start := time.Now()
	c := testenv.StartNATSCluster(t, 3,
		testenv.WithNATSConfig(`authorization { users = [ {user: "app", password: "secret"} ] }`))
	t.Logf("cluster ready in %v", time.Since(start).Round(time.Millisecond))
	if urls := strings.Split(c.URLs(), ","); len(urls) != 3 || urls[1] != c.ClientURL(1) {
		t.Fatalf("URLs() = %q", c.URLs())
	}
	if nc, err := nats.Connect(c.URLs()); err == nil {
		nc.Close()
		t.Fatal("a client without credentials was let in: the config snippet was not applied")
	}
	auth := nats.UserInfo("app", "secret")
	nc, err := nats.Connect(c.URLs(), auth, nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "T", Subjects: []string{"t.>"}, Replicas: 3}); err != nil {
		t.Fatal(err)
	}
	publish := func() {
		t.Helper()
		var err error
		for range 100 { // a publish may land in the election after a kill
			if _, err = js.Publish(ctx, "t.x", []byte("x")); err == nil {
				return
			}
			time.Sleep(100 * time.Millisecond)
		}
		t.Fatalf("publish: %v", err)
	}
	publish()

	leader := c.StreamLeader(t, "T", auth)
	killed := time.Now()
	c.Kill(t, leader)
	addr := strings.TrimPrefix(c.ClientURL(leader), "nats://")
	if conn, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
		conn.Close()
		t.Fatalf("node %d still accepts connections after Kill", leader)
	}
	next := c.StreamLeader(t, "T", auth)
	t.Logf("node %d led the stream; node %d leads it %v after the kill", leader, next, time.Since(killed).Round(time.Millisecond))
	if next == leader {
		t.Fatalf("StreamLeader = %d, the killed node", next)
	}
	publish()

	c.Restart(t, leader)
	c.WaitReady(t) // the restarted node caught up with the stream
	info, err := nats.Connect(c.ClientURL(leader), auth)
	if err != nil {
		t.Fatalf("connect to the restarted node: %v", err)
	}
	info.Close()
	st, err := js.Stream(ctx, "T")
	if err != nil {
		t.Fatal(err)
	}
	if si, err := st.Info(ctx); err != nil || si.State.Msgs != 2 || len(si.Cluster.Replicas) != 2 {
		t.Fatalf("stream info after restart: %+v %v, want 2 messages and 2 replicas besides the leader", si, err)
	}
}
