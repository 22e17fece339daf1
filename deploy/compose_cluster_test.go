package deploy

import (
	"net"
	"net/netip"
	"net/url"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/throttler/throttler/internal/config"
)

// composeService is what TestComposeCluster reads of a Compose service.
type composeService struct {
	Image       string            `yaml:"image"`
	Hostname    string            `yaml:"hostname"`
	Command     []string          `yaml:"command"`
	Environment map[string]string `yaml:"environment"`
	Volumes     []string          `yaml:"volumes"`
	Ports       []string          `yaml:"ports"`
	DependsOn   map[string]any    `yaml:"depends_on"`
	Healthcheck map[string]any    `yaml:"healthcheck"`
}

// TestComposeCluster checks deploy/compose/cluster.yml without Docker: the
// services a fleet needs are there with version tags, every name the
// configuration files use is a service, the NATS nodes route to each other
// and load as nats-server reads them, the sentinels watch the master the
// replica follows, and the throttler's file parses with replicas 3 and
// sentinel mode, allowing the Compose network for the sink.
func TestComposeCluster(t *testing.T) {
	var c struct {
		Services map[string]composeService `yaml:"services"`
		Networks map[string]struct {
			IPAM struct {
				Config []struct {
					Subnet string `yaml:"subnet"`
				} `yaml:"config"`
			} `yaml:"ipam"`
		} `yaml:"networks"`
		Volumes map[string]any `yaml:"volumes"`
	}
	readYAML(t, "compose/cluster.yml", &c)
	var names []string
	for n := range c.Services {
		names = append(names, n)
	}
	slices.Sort(names)
	want := []string{"nats-1", "nats-2", "nats-3", "redis-master", "redis-replica", "sentinel-1", "sentinel-2", "sentinel-3",
		"sink", "throttler-1", "throttler-2", "throttler-3"}
	if !slices.Equal(names, want) {
		t.Fatalf("services %v, want %v", names, want)
	}
	ports := map[string]string{}
	for name, s := range c.Services {
		if tag := tagOf(s.Image); s.Image == "" || !versionTag.MatchString(tag) {
			t.Errorf("%s: image %q has no version tag", name, s.Image)
		}
		for dep := range s.DependsOn {
			if _, ok := c.Services[dep]; !ok {
				t.Errorf("%s depends on %s, which is no service", name, dep)
			}
		}
		for _, p := range s.Ports {
			if !strings.HasPrefix(p, "127.0.0.1:") {
				t.Errorf("%s publishes %s beyond the host's loopback", name, p)
			}
			host := strings.Join(strings.Split(p, ":")[:2], ":")
			if other, dup := ports[host]; dup {
				t.Errorf("%s and %s both publish %s", name, other, host)
			}
			ports[host] = name
		}
		for _, v := range s.Volumes {
			src := strings.SplitN(v, ":", 2)[0]
			if strings.HasPrefix(src, "./") {
				if _, err := os.Stat("compose/" + src[2:]); err != nil {
					t.Errorf("%s mounts %s: %v", name, src, err)
				}
			} else if _, ok := c.Volumes[src]; !ok {
				t.Errorf("%s mounts volume %s, which is not declared", name, src)
			}
		}
	}

	// NATS: three nodes named as their hosts, routes to each of them, a
	// health check (the instances wait for it), and a file nats-server
	// loads.
	for _, n := range []string{"nats-1", "nats-2", "nats-3"} {
		s := c.Services[n]
		if s.Environment["NATS_NAME"] != n || s.Hostname != n {
			t.Errorf("%s: NATS_NAME %q, hostname %q; want both %s", n, s.Environment["NATS_NAME"], s.Hostname, n)
		}
		if s.Healthcheck == nil {
			t.Errorf("%s has no health check", n)
		}
		t.Setenv("NATS_NAME", n)
		opts, err := server.ProcessConfigFile("compose/nats-cluster.conf")
		if err != nil {
			t.Fatalf("compose/nats-cluster.conf as %s: %v", n, err)
		}
		if opts.ServerName != n || !opts.JetStream || opts.Cluster.Port != 6222 || opts.Port != 4222 {
			t.Errorf("%s: server_name %q, jetstream %v, cluster port %d, port %d", n, opts.ServerName, opts.JetStream, opts.Cluster.Port, opts.Port)
		}
		var routes []string
		for _, r := range opts.Routes {
			routes = append(routes, r.Hostname())
		}
		slices.Sort(routes)
		if !slices.Equal(routes, []string{"nats-1", "nats-2", "nats-3"}) {
			t.Errorf("routes %v, want the three nodes", routes)
		}
	}

	// Redis: the replica follows the master the sentinels monitor.
	if cmd := strings.Join(c.Services["redis-replica"].Command, " "); !strings.Contains(cmd, "--replicaof redis-master 6379") {
		t.Errorf("redis-replica runs %q, not a replica of redis-master", cmd)
	}
	sentinel := string(mustRead(t, "compose/sentinel.conf"))
	if !strings.Contains(sentinel, "sentinel monitor mymaster redis-master 6379 2") {
		t.Errorf("sentinel.conf does not monitor redis-master as mymaster with quorum 2:\n%s", sentinel)
	}
	for _, n := range []string{"sentinel-1", "sentinel-2", "sentinel-3"} {
		if cmd := strings.Join(c.Services[n].Command, " "); !strings.Contains(cmd, "redis-sentinel") {
			t.Errorf("%s runs %q", n, cmd)
		}
	}

	// The throttlers: one file, R3 on the three nodes, sentinel mode on
	// the three sentinels and the monitored master, the sink allowed.
	for _, n := range []string{"throttler-1", "throttler-2", "throttler-3"} {
		if !slices.ContainsFunc(c.Services[n].Volumes, func(v string) bool {
			return strings.HasPrefix(v, "./throttler-cluster.yaml:")
		}) {
			t.Errorf("%s does not mount throttler-cluster.yaml", n)
		}
	}
	cfg, err := config.Parse("compose/throttler-cluster.yaml", mustRead(t, "compose/throttler-cluster.yaml"), nil)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.NATS.Replicas != 3 {
		t.Errorf("nats.replicas %d, want 3", cfg.NATS.Replicas)
	}
	var natsHosts []string
	for _, u := range strings.Split(cfg.NATS.URL, ",") {
		pu, err := url.Parse(u)
		if err != nil {
			t.Fatal(err)
		}
		natsHosts = append(natsHosts, pu.Hostname())
	}
	slices.Sort(natsHosts)
	if !slices.Equal(natsHosts, []string{"nats-1", "nats-2", "nats-3"}) {
		t.Errorf("nats.url names %v, want the three nodes", natsHosts)
	}
	ru, err := url.Parse(cfg.Redis.URL)
	if err != nil {
		t.Fatal(err)
	}
	sentinels := append([]string{ru.Host}, ru.Query()["addr"]...)
	slices.Sort(sentinels)
	if cfg.Redis.Mode != "sentinel" || ru.Query().Get("master_name") != "mymaster" ||
		!slices.Equal(sentinels, []string{"sentinel-1:26379", "sentinel-2:26379", "sentinel-3:26379"}) {
		t.Errorf("redis: mode %q, url %q; want sentinel mode on the three sentinels for mymaster", cfg.Redis.Mode, cfg.Redis.URL)
	}
	if !strings.Contains(sentinel, "port 26379") {
		t.Error("sentinel.conf does not listen on 26379")
	}
	subnet := netip.MustParsePrefix(c.Networks["throttler"].IPAM.Config[0].Subnet)
	if !slices.Contains(cfg.Dispatch.AllowNetworks, subnet.String()) {
		t.Errorf("dispatch.allow_networks %v does not allow the Compose network %v", cfg.Dispatch.AllowNetworks, subnet)
	}
	for _, l := range cfg.Lanes {
		u, err := url.Parse(l.Target.HTTP.URL)
		if err != nil {
			t.Fatal(err)
		}
		if host, _, _ := net.SplitHostPort(u.Host); host != "sink" {
			t.Errorf("lane %s delivers to %s, not the sink service", l.Name, u.Host)
		}
	}
}
