package testenv

import (
	"errors"
	"fmt"
	"net"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
)

const (
	// clusterSlots is the number of hash slots of a Redis Cluster.
	clusterSlots = 16384
	// clusterNodeTimeout is how long a node may be unreachable before the
	// cluster deems it failed; a replica's promotion follows within about
	// two of them.
	clusterNodeTimeout = "1000"
)

// RedisCluster is a Redis Cluster of redis-server processes on 127.0.0.1,
// started by StartRedisCluster. Nodes 0 … masters-1 start as masters, each
// with an equal share of the slots; node masters+m*replicasPerMaster+k is
// the k-th replica of master m. Its methods are safe for concurrent use.
type RedisCluster struct {
	nodes []*Redis

	mu   sync.Mutex
	lost map[int]int // killed node → a slot it served when killed
}

// StartRedisCluster starts masters*(1+replicasPerMaster) redis-servers with
// --cluster-enabled yes and cluster-node-timeout 1000 ms (client and bus
// ports free on 127.0.0.1, a directory each under t.TempDir()), assigns the
// slots, joins the nodes and sets up the replicas, then waits until every
// node reports cluster_state:ok, knows every other node in its role, and
// every replica is in sync. One master with no replica is a valid cluster
// (every slot on one node). Every process is killed, and waited for, in
// t.Cleanup; when t fails, the end of each node's log is printed.
//
// A replica is promoted when a majority of the masters sees its master
// fail: with fewer than three masters, killing one stops the cluster.
func StartRedisCluster(t testing.TB, masters, replicasPerMaster int) *RedisCluster {
	t.Helper()
	return startRedisCluster(t, masters, replicasPerMaster, false)
}

// StartRedisClusterCLI is StartRedisCluster with the cluster created the
// way an operator creates one: `redis-cli --cluster create <every node>
// --cluster-replicas <replicasPerMaster> --cluster-yes`, which assigns the
// slots, joins the nodes and picks which replica follows which master (so
// the node numbering of StartRedisCluster holds for the masters only:
// redis-cli picks the first masters nodes as masters). It needs redis-cli
// on PATH, and at least three masters.
func StartRedisClusterCLI(t testing.TB, masters, replicasPerMaster int) *RedisCluster {
	t.Helper()
	return startRedisCluster(t, masters, replicasPerMaster, true)
}

func startRedisCluster(t testing.TB, masters, replicasPerMaster int, viaCLI bool) *RedisCluster {
	t.Helper()
	if masters < 1 || replicasPerMaster < 0 {
		t.Fatalf("testenv: StartRedisCluster(%d, %d): want at least one master and no negative replica count", masters, replicasPerMaster)
	}
	lookBin(t, "redis-server", "`apt-get install redis-server` (Debian/Ubuntu) or `brew install redis` (macOS)")
	root := t.TempDir()
	c := &RedisCluster{lost: map[int]int{}}
	logsOnFailure(t, func() []*daemon {
		out := make([]*daemon, len(c.nodes))
		for i, r := range c.nodes {
			out[i] = r.d
		}
		return out
	})
	t.Cleanup(func() {
		for _, r := range c.nodes {
			r.Close()
		}
	})
	n := masters * (1 + replicasPerMaster)
	bus := make([]int, n) // cluster bus ports
	for i := range n {
		// The bus port is given: the default, port+10000, does not
		// exist for a client port above 55535.
		r, err := launchRedis(mkdir(t, root, fmt.Sprintf("node-%d", i)), 2, func(ports []int) []string {
			bus[i] = ports[1] // the last call is the launch that worked
			return []string{
				"--cluster-enabled", "yes",
				"--cluster-config-file", "nodes.conf",
				"--cluster-port", strconv.Itoa(ports[1]),
				"--cluster-node-timeout", clusterNodeTimeout,
				"--repl-diskless-sync-delay", "0",
			}
		})
		if err != nil {
			t.Fatalf("%v", err)
		}
		c.nodes = append(c.nodes, r)
	}

	if viaCLI {
		createWithCLI(t, c.Addrs(), replicasPerMaster)
	} else {
		c.join(t, masters, replicasPerMaster, bus)
	}
	waitFor(t, "the cluster to be ok on every node", func() error {
		return c.eachNode(func(r *Redis, nodes []clusterNode) error {
			info, err := doString(r.Addr, "CLUSTER", "INFO")
			if err != nil {
				return err
			}
			if st := infoField(info, "cluster_state"); st != "ok" {
				return fmt.Errorf("%s: cluster_state %q", r.Addr, st)
			}
			replicas := 0
			for _, nd := range nodes {
				if nd.has("slave") {
					replicas++
				}
			}
			if replicas != n-masters {
				return fmt.Errorf("%s sees %d replicas of %d", r.Addr, replicas, n-masters)
			}
			if repl, err := doString(r.Addr, "INFO", "replication"); err != nil {
				return err
			} else if infoField(repl, "role") == "slave" && infoField(repl, "master_link_status") != "up" {
				return fmt.Errorf("%s: replica not in sync", r.Addr)
			}
			return nil
		})
	})
	return c
}

// join assigns the slots, joins the nodes and sets up the replicas with
// the commands redis-cli --cluster create sends.
func (c *RedisCluster) join(t testing.TB, masters, replicasPerMaster int, bus []int) {
	t.Helper()
	n := len(c.nodes)
	ids := make([]string, n)
	for i, r := range c.nodes {
		id, err := doString(r.Addr, "CLUSTER", "MYID")
		if err != nil {
			t.Fatalf("testenv: %v", err)
		}
		ids[i] = id
	}
	for m := range masters {
		lo, hi := m*clusterSlots/masters, (m+1)*clusterSlots/masters-1
		addr := c.nodes[m].Addr
		// Distinct config epochs, as redis-cli --cluster create sets them:
		// no collision for the cluster to resolve.
		mustDo(t, addr, "CLUSTER", "SET-CONFIG-EPOCH", strconv.Itoa(m+1))
		mustDo(t, addr, "CLUSTER", "ADDSLOTSRANGE", strconv.Itoa(lo), strconv.Itoa(hi))
	}
	host, port, err := net.SplitHostPort(c.nodes[0].Addr)
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	for _, r := range c.nodes[1:] {
		mustDo(t, r.Addr, "CLUSTER", "MEET", host, port, strconv.Itoa(bus[0]))
	}
	waitFor(t, "every node to know every other", func() error {
		return c.eachNode(func(r *Redis, nodes []clusterNode) error {
			if len(nodes) != n {
				return fmt.Errorf("%s knows %d nodes of %d", r.Addr, len(nodes), n)
			}
			for _, nd := range nodes {
				if nd.has("handshake") || nd.has("noaddr") {
					return fmt.Errorf("%s sees %s as %s", r.Addr, nd.addr, nd.flags)
				}
			}
			return nil
		})
	})
	for i := masters; i < n; i++ {
		mustDo(t, c.nodes[i].Addr, "CLUSTER", "REPLICATE", ids[(i-masters)/replicasPerMaster])
	}
}

// createWithCLI runs redis-cli --cluster create over addrs.
func createWithCLI(t testing.TB, addrs []string, replicasPerMaster int) {
	t.Helper()
	cli := lookBin(t, "redis-cli", "`apt-get install redis-tools` (Debian/Ubuntu) or `brew install redis` (macOS)")
	args := append([]string{"--cluster", "create"}, addrs...)
	args = append(args, "--cluster-replicas", strconv.Itoa(replicasPerMaster), "--cluster-yes")
	out, err := exec.Command(cli, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("testenv: redis-cli %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	if !strings.Contains(string(out), "All 16384 slots covered") {
		t.Fatalf("testenv: redis-cli --cluster create did not cover every slot:\n%s", out)
	}
}

// mustDo runs a command that must succeed.
func mustDo(t testing.TB, addr string, args ...string) {
	t.Helper()
	if _, err := do(addr, args...); err != nil {
		t.Fatalf("testenv: %v", err)
	}
}

// URL is the cluster URL the throttler's configuration takes with
// redis.mode cluster (redis.ParseClusterURL): the first node as the host,
// every other as an addr parameter, e.g.
// redis://127.0.0.1:P0?addr=127.0.0.1:P1&addr=127.0.0.1:P2.
func (c *RedisCluster) URL() string {
	addrs := c.Addrs()
	var b strings.Builder
	b.WriteString("redis://" + addrs[0])
	for i, a := range addrs[1:] {
		if i == 0 {
			b.WriteString("?addr=" + a)
		} else {
			b.WriteString("&addr=" + a)
		}
	}
	return b.String()
}

// Addrs lists the nodes' host:port addresses, by node index.
func (c *RedisCluster) Addrs() []string {
	out := make([]string, len(c.nodes))
	for i, r := range c.nodes {
		out[i] = r.Addr
	}
	return out
}

// KillNode kills node i (SIGKILL) and waits until its port refuses
// connections. Killing a killed node does nothing.
func (c *RedisCluster) KillNode(t testing.TB, i int) {
	t.Helper()
	if !c.nodes[i].d.running() {
		return
	}
	if slot, ok := c.slotOf(i); ok {
		c.mu.Lock()
		c.lost[i] = slot
		c.mu.Unlock()
	}
	c.nodes[i].Stop(t)
}

// NodeForKey returns the index of the master serving key's slot, as the
// first running node sees the cluster.
func (c *RedisCluster) NodeForKey(t testing.TB, key string) int {
	t.Helper()
	for _, r := range c.nodes {
		if !r.d.running() {
			continue
		}
		v, err := do(r.Addr, "CLUSTER", "KEYSLOT", key)
		if err != nil {
			t.Fatalf("testenv: %v", err)
		}
		slot, _ := v.(int64)
		i, err := c.servingSlot(r.Addr, int(slot))
		if err != nil {
			t.Fatalf("testenv: %v", err)
		}
		return i
	}
	t.Fatal("testenv: no node of the cluster runs")
	return -1
}

// WaitFailover waits until a replica of node killed (stopped by KillNode
// while it was a master) is promoted: every running node reports
// cluster_state:ok and names the same running node as the master of the
// slots killed served. It returns that node's index.
func (c *RedisCluster) WaitFailover(t testing.TB, killed int) int {
	t.Helper()
	c.mu.Lock()
	slot, ok := c.lost[killed]
	c.mu.Unlock()
	if !ok {
		t.Fatalf("testenv: node %d was not a master killed by KillNode", killed)
	}
	promoted := -1
	waitFor(t, fmt.Sprintf("a replica of node %d to be promoted", killed), func() error {
		promoted = -1
		for _, r := range c.nodes {
			if !r.d.running() {
				continue
			}
			info, err := doString(r.Addr, "CLUSTER", "INFO")
			if err != nil {
				return err
			}
			if st := infoField(info, "cluster_state"); st != "ok" {
				return fmt.Errorf("%s: cluster_state %q", r.Addr, st)
			}
			i, err := c.servingSlot(r.Addr, slot)
			if err != nil {
				return err
			}
			if i == killed || !c.nodes[i].d.running() {
				return fmt.Errorf("%s: slot %d still served by node %d", r.Addr, slot, i)
			}
			if promoted >= 0 && i != promoted {
				return fmt.Errorf("slot %d served by nodes %d and %d", slot, promoted, i)
			}
			promoted = i
		}
		if promoted < 0 {
			return errors.New("no node of the cluster runs")
		}
		return nil
	})
	return promoted
}

// slotOf returns a slot node i serves as a master, as another running node
// sees it.
func (c *RedisCluster) slotOf(i int) (int, bool) {
	for j, r := range c.nodes {
		if j == i || !r.d.running() {
			continue
		}
		ranges, err := c.slots(r.Addr)
		if err != nil {
			continue
		}
		for _, sr := range ranges {
			if sr.master == i {
				return sr.lo, true
			}
		}
		return 0, false
	}
	return 0, false
}

// servingSlot returns the index of the node that addr sees as the master
// of slot.
func (c *RedisCluster) servingSlot(addr string, slot int) (int, error) {
	ranges, err := c.slots(addr)
	if err != nil {
		return -1, err
	}
	for _, sr := range ranges {
		if sr.lo <= slot && slot <= sr.hi {
			return sr.master, nil
		}
	}
	return -1, fmt.Errorf("%s: no node serves slot %d", addr, slot)
}

// slotRange is one entry of CLUSTER SLOTS: a range and its master's index.
type slotRange struct {
	lo, hi, master int
}

// slots asks addr for CLUSTER SLOTS and maps the masters to node indexes.
func (c *RedisCluster) slots(addr string) ([]slotRange, error) {
	v, err := do(addr, "CLUSTER", "SLOTS")
	if err != nil {
		return nil, err
	}
	entries, _ := v.([]any)
	out := make([]slotRange, 0, len(entries))
	for _, e := range entries {
		f, _ := e.([]any)
		if len(f) < 3 {
			return nil, fmt.Errorf("%s: CLUSTER SLOTS entry %v", addr, e)
		}
		lo, _ := f[0].(int64)
		hi, _ := f[1].(int64)
		m, _ := f[2].([]any)
		if len(m) < 2 {
			return nil, fmt.Errorf("%s: CLUSTER SLOTS entry %v", addr, e)
		}
		port, _ := m[1].(int64)
		master := -1
		for i, r := range c.nodes {
			if _, p, _ := net.SplitHostPort(r.Addr); p == strconv.FormatInt(port, 10) {
				master = i
			}
		}
		if master < 0 {
			return nil, fmt.Errorf("%s: CLUSTER SLOTS names port %d, not a node of this cluster", addr, port)
		}
		out = append(out, slotRange{lo: int(lo), hi: int(hi), master: master})
	}
	return out, nil
}

// clusterNode is one line of CLUSTER NODES.
type clusterNode struct {
	addr  string
	flags []string
}

func (n clusterNode) has(flag string) bool { return slices.Contains(n.flags, flag) }

// eachNode calls check with every running node and its CLUSTER NODES.
func (c *RedisCluster) eachNode(check func(r *Redis, nodes []clusterNode) error) error {
	for _, r := range c.nodes {
		if !r.d.running() {
			continue
		}
		out, err := doString(r.Addr, "CLUSTER", "NODES")
		if err != nil {
			return err
		}
		var nodes []clusterNode
		for line := range strings.SplitSeq(strings.TrimSpace(out), "\n") {
			// <id> <ip:port@cport> <flags> <master> …
			f := strings.Fields(line)
			if len(f) < 3 {
				return fmt.Errorf("%s: CLUSTER NODES line %q", r.Addr, line)
			}
			nodes = append(nodes, clusterNode{addr: f[1], flags: strings.Split(f[2], ",")})
		}
		if err := check(r, nodes); err != nil {
			return err
		}
	}
	return nil
}
