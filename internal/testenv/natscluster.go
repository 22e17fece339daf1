package testenv

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
)

const (
	// natsReadyTimeout bounds how long a JetStream cluster may take to elect
	// its meta leader, and a stream to report a leader.
	natsReadyTimeout = 30 * time.Second
	// natsModule is the module nats-server is built from.
	natsModule = "github.com/nats-io/nats-server/v2"
)

// NATSCluster is a JetStream cluster of real nats-server processes on
// 127.0.0.1, one store directory each, started by StartNATSCluster. Nodes
// are numbered from 0; node i has server_name "n<i>". Its methods are safe
// for concurrent use.
type NATSCluster struct {
	nodes []*natsNode
}

// natsNode is one nats-server of a cluster.
type natsNode struct {
	name    string
	client  string // host:port for clients
	monitor string // host:port of the HTTP monitoring endpoint
	d       *daemon
}

// NATSClusterOption configures StartNATSCluster.
type NATSClusterOption func(*natsClusterConfig)

type natsClusterConfig struct {
	extra []string
}

// WithNATSConfig appends snippet to every node's configuration file, for
// instance an authorization or accounts block. Clients then need the
// matching nats.Option (nats.UserInfo, …), which StreamLeader takes too.
func WithNATSConfig(snippet string) NATSClusterOption {
	return func(c *natsClusterConfig) { c.extra = append(c.extra, snippet) }
}

// StartNATSCluster starts n nats-server processes forming a JetStream
// cluster (routes between every pair, client, route and monitoring ports
// free on 127.0.0.1, a store directory each under t.TempDir()) and waits
// until every node reports healthy: a JetStream meta leader is elected and
// every node is current with it. Every process is killed, and waited for, in
// t.Cleanup; when t fails, the end of each node's log is printed.
//
// The nats-server binary is built from the nats-server module in go.mod,
// once per machine and module version (see natsServerBinary); building it
// needs the go command on PATH.
func StartNATSCluster(t testing.TB, n int, opts ...NATSClusterOption) *NATSCluster {
	t.Helper()
	if n < 1 {
		t.Fatalf("testenv: StartNATSCluster: n = %d, want at least 1", n)
	}
	var cfg natsClusterConfig
	for _, o := range opts {
		o(&cfg)
	}
	bin, err := natsServerBinary()
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	root := t.TempDir()
	c := &NATSCluster{}
	logsOnFailure(t, func() []*daemon {
		out := make([]*daemon, len(c.nodes))
		for i, nd := range c.nodes {
			out[i] = nd.d
		}
		return out
	})
	t.Cleanup(func() {
		for _, nd := range c.nodes {
			nd.d.kill()
		}
	})

	// Every node names every route port in its file, so a port taken
	// before its server bound it restarts the whole cluster on new ports.
	for attempt := 1; ; attempt++ {
		nodes, err := newNATSNodes(root, bin, n, cfg)
		if err != nil {
			t.Fatalf("testenv: %v", err)
		}
		c.nodes = nodes
		if err = startNATSNodes(nodes); err == nil {
			break
		}
		if !errors.Is(err, errAddrInUse) || attempt == startAttempts {
			t.Fatalf("testenv: start nats-server: %v", err)
		}
	}
	c.WaitReady(t)
	return c
}

// startNATSNodes starts every node, or none.
func startNATSNodes(nodes []*natsNode) error {
	for _, nd := range nodes {
		if err := nd.d.start(); err != nil {
			for _, started := range nodes {
				started.d.kill()
			}
			return err
		}
	}
	return nil
}

// newNATSNodes writes the configuration files of n nodes on fresh ports,
// with empty store directories.
func newNATSNodes(root, bin string, n int, cfg natsClusterConfig) ([]*natsNode, error) {
	ports, err := freePorts(3 * n) // client, route, monitoring
	if err != nil {
		return nil, err
	}
	routes := make([]string, n)
	for i := range n {
		routes[i] = "nats-route://" + loopback(ports[3*i+1])
	}
	nodes := make([]*natsNode, n)
	for i := range n {
		name := fmt.Sprintf("n%d", i)
		dir := filepath.Join(root, name)
		if err := os.RemoveAll(dir); err != nil {
			return nil, err
		}
		store := filepath.Join(dir, "store")
		if err := os.MkdirAll(store, 0o755); err != nil {
			return nil, err
		}
		nd := &natsNode{name: name, client: loopback(ports[3*i]), monitor: loopback(ports[3*i+2])}
		conf := fmt.Sprintf(`server_name: %q
listen: %q
http: %q
jetstream {
  store_dir: %q
}
cluster {
  name: "testenv"
  listen: %q
  routes: [%s]
}
%s
`, name, nd.client, nd.monitor, store, loopback(ports[3*i+1]), strings.Join(routes, ", "), strings.Join(cfg.extra, "\n"))
		path := filepath.Join(dir, "nats.conf")
		if err := os.WriteFile(path, []byte(conf), 0o644); err != nil {
			return nil, err
		}
		nd.d = &daemon{name: "nats-" + name, bin: bin, dir: dir, addr: nd.client, args: []string{"-c", path}, ready: natsInfo}
		nodes[i] = nd
	}
	return nodes, nil
}

// URLs is every node's client URL, comma-separated: the form nats.Connect
// and the throttler's nats.url take.
func (c *NATSCluster) URLs() string {
	urls := make([]string, len(c.nodes))
	for i := range c.nodes {
		urls[i] = c.ClientURL(i)
	}
	return strings.Join(urls, ",")
}

// ClientURL is node i's client URL.
func (c *NATSCluster) ClientURL(i int) string {
	return "nats://" + c.nodes[i].client
}

// Kill kills node i (SIGKILL) and waits until its client port refuses
// connections. Killing a killed node does nothing.
func (c *NATSCluster) Kill(t testing.TB, i int) {
	t.Helper()
	if err := c.nodes[i].d.stop(); err != nil {
		t.Fatalf("testenv: nats-server %s: %v", c.nodes[i].name, err)
	}
}

// Restart starts node i again after Kill, on the same ports and store
// directory, and waits until it accepts client connections. WaitReady then
// waits until it caught up. Restarting a running node does nothing.
func (c *NATSCluster) Restart(t testing.TB, i int) {
	t.Helper()
	if err := c.nodes[i].d.restart(); err != nil {
		t.Fatalf("testenv: restart nats-server %s: %v", c.nodes[i].name, err)
	}
}

// WaitReady waits until every running node answers its health check (GET
// /healthz): JetStream has a meta leader, and the node is current with it
// and with the streams and consumers it holds. That needs a quorum of the
// cluster's nodes running.
func (c *NATSCluster) WaitReady(t testing.TB) {
	t.Helper()
	client := &http.Client{Timeout: time.Second}
	defer client.CloseIdleConnections()
	deadline := time.Now().Add(natsReadyTimeout)
	for _, nd := range c.nodes {
		for nd.d.running() {
			status, err := natsHealth(client, nd.monitor)
			if err == nil {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("testenv: nats-server %s not healthy within %v: %v (%s)", nd.name, natsReadyTimeout, err, status)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
}

// natsHealth asks a node's /healthz; a nil error means healthy.
func natsHealth(client *http.Client, monitor string) (string, error) {
	resp, err := client.Get("http://" + monitor + "/healthz")
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	var h struct {
		Status string `json:"status"`
		Error  string `json:"error"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&h); err != nil {
		return "", fmt.Errorf("healthz: %w", err)
	}
	if resp.StatusCode != http.StatusOK {
		return h.Status, fmt.Errorf("healthz %d: %s", resp.StatusCode, h.Error)
	}
	return h.Status, nil
}

// StreamLeader returns the index of the running node that leads stream, as
// $JS.API.STREAM.INFO.<stream> reports it (cluster.leader), waiting until
// the stream has a leader that runs: after a Kill of the leader, it returns
// once a new leader is elected. opts are for connecting to the cluster (the
// credentials of a WithNATSConfig).
func (c *NATSCluster) StreamLeader(t testing.TB, stream string, opts ...nats.Option) int {
	t.Helper()
	deadline := time.Now().Add(natsReadyTimeout)
	for {
		leader, err := c.streamLeader(stream, opts)
		switch {
		case err == nil && leader < 0:
			err = errors.New("no leader reported")
		case err == nil && !c.nodes[leader].d.running():
			err = fmt.Errorf("the leader %s is killed", c.nodes[leader].name)
		case err == nil:
			return leader
		}
		if time.Now().After(deadline) {
			t.Fatalf("testenv: stream %s has no running leader within %v: %v", stream, natsReadyTimeout, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// streamLeader asks for a stream's info once, over a connection of its own
// (the node it reaches may be killed next), and maps its leader's
// server_name to a node index (-1 when none is reported).
func (c *NATSCluster) streamLeader(stream string, opts []nats.Option) (int, error) {
	nc, err := nats.Connect(c.URLs(), append([]nats.Option{nats.Timeout(time.Second), nats.NoReconnect()}, opts...)...)
	if err != nil {
		return -1, err
	}
	defer nc.Close()
	msg, err := nc.Request("$JS.API.STREAM.INFO."+stream, nil, time.Second)
	if err != nil {
		return -1, err
	}
	var info struct {
		Cluster *struct {
			Leader string `json:"leader"`
		} `json:"cluster"`
		Error *struct {
			Code        int    `json:"code"`
			Description string `json:"description"`
		} `json:"error"`
	}
	if err := json.Unmarshal(msg.Data, &info); err != nil {
		return -1, fmt.Errorf("stream info: %w", err)
	}
	if info.Error != nil {
		return -1, fmt.Errorf("stream info: %d %s", info.Error.Code, info.Error.Description)
	}
	if info.Cluster == nil || info.Cluster.Leader == "" {
		return -1, nil
	}
	for i, nd := range c.nodes {
		if nd.name == info.Cluster.Leader {
			return i, nil
		}
	}
	return -1, fmt.Errorf("stream info names leader %q, not a node of this cluster", info.Cluster.Leader)
}

// natsInfo checks that a nats-server accepts clients: it greets them with
// its INFO line.
func natsInfo(addr string) error {
	c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
	if err != nil {
		return err
	}
	defer c.Close()
	if err := c.SetDeadline(time.Now().Add(time.Second)); err != nil {
		return err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return err
	}
	if !strings.HasPrefix(line, "INFO ") {
		return fmt.Errorf("greeted with %q", line)
	}
	return nil
}

// natsServerBin is the nats-server binary, built once per test binary.
var natsServerBin struct {
	once sync.Once
	path string
	err  error
}

// natsServerBinary returns the path of a nats-server executable built from
// the nats-server module this binary links, under the user's cache
// directory (os.TempDir when there is none) with the module version, OS and
// architecture in its name: the first test binary on a machine builds it,
// every later one reuses it.
func natsServerBinary() (string, error) {
	natsServerBin.once.Do(func() {
		natsServerBin.path, natsServerBin.err = buildNATSServer()
	})
	return natsServerBin.path, natsServerBin.err
}

func buildNATSServer() (string, error) {
	goBin, err := exec.LookPath("go")
	if err != nil {
		return "", fmt.Errorf("building nats-server needs the go command on PATH: %w", err)
	}
	version := ""
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, m := range bi.Deps {
			if m.Path == natsModule {
				version = m.Version
				if m.Replace != nil {
					version = m.Replace.Version
				}
			}
		}
	}
	if version == "" {
		// Test binaries carry no module list: ask the module the test
		// runs in (its directory is the package's).
		out, err := exec.Command(goBin, "list", "-m", "-f", "{{if .Replace}}{{.Replace.Version}}{{else}}{{.Version}}{{end}}", natsModule).Output()
		if err != nil {
			return "", fmt.Errorf("go list -m %s: %w", natsModule, err)
		}
		version = strings.TrimSpace(string(out))
	}
	if version == "" {
		return "", fmt.Errorf("no version of %s: is it replaced by a directory?", natsModule)
	}
	cache, err := os.UserCacheDir()
	if err != nil {
		cache = os.TempDir()
	}
	dir := filepath.Join(cache, "throttler-testenv")
	bin := filepath.Join(dir, fmt.Sprintf("nats-server-%s-%s-%s", version, runtime.GOOS, runtime.GOARCH))
	if _, err := os.Stat(bin); err == nil {
		return bin, nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("build nats-server: %w", err)
	}
	// Build under a temporary name and rename: test binaries of several
	// packages may build at the same time, and none must run a half-written
	// file.
	tmp, err := os.CreateTemp(dir, "nats-server-build-")
	if err != nil {
		return "", fmt.Errorf("build nats-server: %w", err)
	}
	tmp.Close()
	defer os.Remove(tmp.Name())
	// Built from the module the test runs in, so go.mod pins the version.
	out, err := exec.Command(goBin, "build", "-o", tmp.Name(), natsModule).CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("go build %s: %w: %s", natsModule, err, strings.TrimSpace(string(out)))
	}
	if err := os.Rename(tmp.Name(), bin); err != nil {
		return "", fmt.Errorf("build nats-server: %w", err)
	}
	return bin, nil
}
