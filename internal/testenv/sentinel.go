package testenv

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"
)

const (
	// sentinelMaster is the name the sentinels monitor the master under.
	sentinelMaster = "mymaster"
	// sentinelDownAfter is how long a master may be silent before a
	// sentinel deems it down; with quorum 2 a failover follows within
	// seconds.
	sentinelDownAfter = 1000 * time.Millisecond
	// sentinelFailoverTimeout bounds one failover attempt.
	sentinelFailoverTimeout = 3000 * time.Millisecond
)

// RedisSentinel is a master, one replica and three redis-sentinel processes
// monitoring them with quorum 2, all on 127.0.0.1, started by
// StartRedisSentinel. Its methods are safe for concurrent use.
type RedisSentinel struct {
	servers   []*Redis  // the initial master, then the replica
	sentinels []*daemon // three redis-sentinel processes
}

// StartRedisSentinel starts a redis-server master, a replica of it and three
// redis-sentinel processes (quorum 2, down-after-milliseconds 1000,
// failover-timeout 3000) on free 127.0.0.1 ports, each in a directory of its
// own under t.TempDir(), and waits until the replica is in sync and every
// sentinel knows the replica and the two other sentinels: a failover then
// completes in a few seconds. Every process is killed, and waited for, in
// t.Cleanup; when t fails, the end of each process's log is printed.
//
// When redis-server or redis-sentinel is not on PATH, StartRedisSentinel
// fails t with how to install it.
func StartRedisSentinel(t testing.TB) *RedisSentinel {
	t.Helper()
	lookBin(t, "redis-server", "`apt-get install redis-server` (Debian/Ubuntu) or `brew install redis` (macOS)")
	sentinelBin := lookBin(t, "redis-sentinel", "`apt-get install redis-sentinel` (Debian/Ubuntu) or `brew install redis` (macOS)")
	root := t.TempDir()
	s := &RedisSentinel{}
	logsOnFailure(t, func() []*daemon {
		var out []*daemon
		for _, r := range s.servers {
			out = append(out, r.d)
		}
		return append(out, s.sentinels...)
	})
	t.Cleanup(func() {
		for _, d := range s.sentinels {
			d.kill()
		}
		for _, r := range s.servers {
			r.Close()
		}
	})

	// A replica syncs at once, not after diskless sync's default 5 s
	// wait for more replicas; both servers get it, as either may be the
	// master after a failover.
	fastSync := []string{"--repl-diskless-sync-delay", "0"}
	master, err := launchRedis(mkdir(t, root, "master"), 1, func([]int) []string { return fastSync })
	if err != nil {
		t.Fatalf("%v", err)
	}
	s.servers = append(s.servers, master)
	host, port, err := net.SplitHostPort(master.Addr)
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	replica, err := launchRedis(mkdir(t, root, "replica"), 1, func([]int) []string { return slices.Concat(fastSync, []string{"--replicaof", host, port}) })
	if err != nil {
		t.Fatalf("%v", err)
	}
	s.servers = append(s.servers, replica)
	waitFor(t, "the replica to sync with the master", func() error {
		info, err := doString(replica.Addr, "INFO", "replication")
		if err != nil {
			return err
		}
		if st := infoField(info, "master_link_status"); st != "up" {
			return fmt.Errorf("master_link_status %q", st)
		}
		return nil
	})

	for i := range 3 {
		dir := mkdir(t, root, fmt.Sprintf("sentinel-%d", i))
		d, err := launch(1, func(ports []int) (*daemon, error) {
			// A sentinel rewrites its file with what it learns: one each.
			conf := filepath.Join(dir, "sentinel.conf")
			body := fmt.Sprintf(`port %d
bind 127.0.0.1
daemonize no
dir %q
sentinel monitor %s %s %s 2
sentinel down-after-milliseconds %s %d
sentinel failover-timeout %s %d
sentinel parallel-syncs %s 1
`, ports[0], dir, sentinelMaster, host, port, sentinelMaster, sentinelDownAfter.Milliseconds(),
				sentinelMaster, sentinelFailoverTimeout.Milliseconds(), sentinelMaster)
			if err := os.WriteFile(conf, []byte(body), 0o644); err != nil {
				return nil, err
			}
			return &daemon{name: "redis-sentinel", bin: sentinelBin, dir: dir, addr: loopback(ports[0]), args: []string{conf}, ready: ping}, nil
		})
		if err != nil {
			t.Fatalf("testenv: start redis-sentinel: %v", err)
		}
		s.sentinels = append(s.sentinels, d)
	}
	for _, d := range s.sentinels {
		waitFor(t, "sentinel "+d.addr+" to know the replica and the other sentinels", func() error {
			v, err := do(d.addr, "SENTINEL", "MASTER", sentinelMaster)
			if err != nil {
				return err
			}
			m := fieldMap(v)
			if m["num-slaves"] != "1" || m["num-other-sentinels"] != "2" {
				return fmt.Errorf("num-slaves %q, num-other-sentinels %q", m["num-slaves"], m["num-other-sentinels"])
			}
			return nil
		})
	}
	return s
}

// MasterName is the name the sentinels monitor the master under.
func (s *RedisSentinel) MasterName() string { return sentinelMaster }

// SentinelAddrs lists the sentinels' host:port addresses.
func (s *RedisSentinel) SentinelAddrs() []string {
	out := make([]string, len(s.sentinels))
	for i, d := range s.sentinels {
		out[i] = d.addr
	}
	return out
}

// URL is the failover URL the throttler's configuration takes with
// redis.mode sentinel (redis.ParseFailoverURL): the first sentinel as the
// host, the master name and the other sentinels as query parameters, e.g.
// redis://127.0.0.1:P1/0?master_name=mymaster&addr=127.0.0.1:P2&addr=127.0.0.1:P3.
func (s *RedisSentinel) URL() string {
	q := url.Values{"master_name": {sentinelMaster}}
	for _, d := range s.sentinels[1:] {
		q.Add("addr", d.addr)
	}
	return "redis://" + s.sentinels[0].addr + "/0?" + q.Encode()
}

// MasterAddr is the master's host:port as the first running sentinel
// reports it (SENTINEL get-master-addr-by-name).
func (s *RedisSentinel) MasterAddr(t testing.TB) string {
	t.Helper()
	var last error
	for _, d := range s.sentinels {
		if !d.running() {
			continue
		}
		addr, err := sentinelMasterAddr(d.addr)
		if err == nil {
			return addr
		}
		last = err
	}
	t.Fatalf("testenv: no sentinel names the master: %v", last)
	return ""
}

// KillMaster kills the redis-server the sentinels name as the master
// (SIGKILL), waits until its port refuses connections, and returns its
// address, to give to WaitFailover.
func (s *RedisSentinel) KillMaster(t testing.TB) string {
	t.Helper()
	addr := s.MasterAddr(t)
	for _, r := range s.servers {
		if r.Addr == addr {
			r.Stop(t)
			return addr
		}
	}
	t.Fatalf("testenv: the sentinels name %s as the master, not a server of this fleet", addr)
	return ""
}

// WaitFailover waits until every running sentinel names a master other
// than old, all the same one, and that server answers ROLE as a master;
// it returns the new master's address.
func (s *RedisSentinel) WaitFailover(t testing.TB, old string) string {
	t.Helper()
	var addr string
	waitFor(t, "a failover from "+old, func() error {
		addr = ""
		for _, d := range s.sentinels {
			if !d.running() {
				continue
			}
			a, err := sentinelMasterAddr(d.addr)
			if err != nil {
				return err
			}
			if a == old {
				return fmt.Errorf("sentinel %s still names %s", d.addr, old)
			}
			if addr != "" && a != addr {
				return fmt.Errorf("the sentinels name %s and %s", addr, a)
			}
			addr = a
		}
		if addr == "" {
			return errors.New("no sentinel runs")
		}
		role, err := do(addr, "ROLE")
		if err != nil {
			return err
		}
		if r, ok := role.([]any); !ok || len(r) == 0 || r[0] != "master" {
			return fmt.Errorf("%s answers ROLE %v", addr, role)
		}
		return nil
	})
	return addr
}

// sentinelMasterAddr asks one sentinel for the master's address.
func sentinelMasterAddr(sentinel string) (string, error) {
	v, err := do(sentinel, "SENTINEL", "GET-MASTER-ADDR-BY-NAME", sentinelMaster)
	if err != nil {
		return "", err
	}
	a, ok := v.([]any)
	if !ok || len(a) != 2 {
		return "", fmt.Errorf("sentinel %s: get-master-addr-by-name answered %v", sentinel, v)
	}
	host, _ := a[0].(string)
	port, _ := a[1].(string)
	return host + ":" + port, nil
}
