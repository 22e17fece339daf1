package deploy

import (
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"

	"github.com/throttler/throttler/internal/config"
)

// manifests reads every document of the Kubernetes files, by kind.
func manifests(t *testing.T) map[string]map[string]any {
	t.Helper()
	files, err := filepath.Glob("kubernetes/*.yaml")
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]map[string]any{}
	for _, f := range files {
		raw, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		dec := yaml.NewDecoder(bytes.NewReader(raw))
		for {
			var doc map[string]any
			if err := dec.Decode(&doc); errors.Is(err, io.EOF) {
				break
			} else if err != nil {
				t.Fatalf("%s: %v", f, err)
			}
			kind, _ := doc["kind"].(string)
			out[kind] = doc
		}
	}
	return out
}

// dig walks a decoded YAML document by keys (strings) and indexes (ints).
func dig(t *testing.T, v any, path ...any) any {
	t.Helper()
	for _, p := range path {
		switch k := p.(type) {
		case string:
			m, ok := v.(map[string]any)
			if !ok {
				t.Fatalf("%v: not a mapping at %q", path, k)
			}
			v = m[k]
		case int:
			l, ok := v.([]any)
			if !ok || k >= len(l) {
				t.Fatalf("%v: no item %d", path, k)
			}
			v = l[k]
		}
	}
	return v
}

// versionTag is a release version: v1.2.3, 1.2.3, 2.12, 7 (never latest,
// dev or a branch name).
var versionTag = regexp.MustCompile(`^v?[0-9]+(\.[0-9]+){0,2}([-+][0-9A-Za-z.-]+)?$`)

// tagOf returns an image reference's tag, with Compose's ${VAR:-default}
// resolved to its default.
func tagOf(image string) string {
	image = regexp.MustCompile(`\$\{[A-Z_]+:-([^}]*)\}`).ReplaceAllString(image, "$1")
	if i := strings.LastIndex(image, ":"); i > strings.LastIndex(image, "/") {
		return image[i+1:]
	}
	return ""
}

// TestImagesHaveVersionTags: every image the examples run is pinned to a
// version: a rollout runs one build and a rollback names the one it goes
// back to.
func TestImagesHaveVersionTags(t *testing.T) {
	k := manifests(t)
	var images []string
	images = append(images, dig(t, k["Deployment"], "spec", "template", "spec", "containers", 0, "image").(string))
	var kustRaw struct {
		Images []map[string]string `yaml:"images"`
	}
	readYAML(t, "kubernetes/kustomization.yaml", &kustRaw)
	for _, im := range kustRaw.Images {
		images = append(images, im["newName"]+":"+im["newTag"])
	}
	var compose struct {
		Services map[string]struct {
			Image string `yaml:"image"`
		} `yaml:"services"`
	}
	readYAML(t, "compose/docker-compose.yml", &compose)
	for name, s := range compose.Services {
		if s.Image == "" {
			t.Errorf("compose service %s has no image", name)
		}
		images = append(images, s.Image)
	}
	if len(images) < 6 {
		t.Fatalf("only %d images found: %v", len(images), images)
	}
	for _, im := range images {
		if tag := tagOf(im); !versionTag.MatchString(tag) {
			t.Errorf("image %q: tag %q is not a version", im, tag)
		}
	}
	// The Deployment's own tag and the kustomization's agree, so that the
	// manifest applied without kustomize runs the same version.
	if dep, kt := tagOf(images[0]), kustRaw.Images[0]["newTag"]; dep != kt {
		t.Errorf("deployment.yaml has tag %s, kustomization.yaml %s", dep, kt)
	}
}

// TestDeploymentBounds: the pod has memory bounds (and GOMEMLIMIT follows
// the limit), CPU and memory requests, and no CPU limit (throttling would
// make the drain miss its slots).
func TestDeploymentBounds(t *testing.T) {
	c := dig(t, manifests(t)["Deployment"], "spec", "template", "spec", "containers", 0).(map[string]any)
	res := dig(t, c, "resources").(map[string]any)
	for _, p := range [][]any{{"requests", "cpu"}, {"requests", "memory"}, {"limits", "memory"}} {
		if v := dig(t, res, p...); v == nil || v == "" {
			t.Errorf("resources.%s.%s is not set", p[0], p[1])
		}
	}
	if v := dig(t, res, "limits", "cpu"); v != nil {
		t.Errorf("resources.limits.cpu is %v; a CPU limit throttles the drain", v)
	}
	gomem := false
	for _, e := range dig(t, c, "env").([]any) {
		e := e.(map[string]any)
		if e["name"] == "GOMEMLIMIT" && dig(t, e, "valueFrom", "resourceFieldRef", "resource") == "limits.memory" {
			gomem = true
		}
	}
	if !gomem {
		t.Error("GOMEMLIMIT does not follow limits.memory")
	}
	sc := dig(t, c, "securityContext").(map[string]any)
	if sc["readOnlyRootFilesystem"] != true || sc["allowPrivilegeEscalation"] != false {
		t.Errorf("container securityContext %v", sc)
	}
}

// TestNetworkPolicy: ingress and egress both restricted; the pods may
// reach DNS, NATS and Redis, and take the API port from the namespace and
// Prometheus.
func TestNetworkPolicy(t *testing.T) {
	np := manifests(t)["NetworkPolicy"]
	if np == nil {
		t.Fatal("no NetworkPolicy")
	}
	types := dig(t, np, "spec", "policyTypes").([]any)
	if !slices.Contains(types, any("Ingress")) || !slices.Contains(types, any("Egress")) {
		t.Fatalf("policyTypes %v, want Ingress and Egress", types)
	}
	ports := map[int]bool{}
	for _, rule := range dig(t, np, "spec", "egress").([]any) {
		for _, p := range dig(t, rule, "ports").([]any) {
			if n, ok := dig(t, p, "port").(int); ok {
				ports[n] = true
			}
		}
	}
	for _, want := range []int{53, 4222, 6379, 443} {
		if !ports[want] {
			t.Errorf("no egress to port %d", want)
		}
	}
	in := dig(t, np, "spec", "ingress", 0, "ports", 0, "port")
	if in != "http" && in != 8080 {
		t.Errorf("ingress port %v, want the API's", in)
	}
}

// TestConfigMapLoads: the Kubernetes config (with the Secret's keys file)
// passes the service's own validation, and runs its streams with three
// replicas on the external NATS cluster.
func TestConfigMapLoads(t *testing.T) {
	k := manifests(t)
	raw := dig(t, k["ConfigMap"], "data", "throttler.yaml").(string)
	keys := dig(t, k["Secret"], "stringData", "keys.yaml").(string)
	keysPath := filepath.Join(t.TempDir(), "keys.yaml")
	if err := os.WriteFile(keysPath, []byte(keys), 0o600); err != nil {
		t.Fatal(err)
	}
	const mounted = "/etc/throttler/auth/keys.yaml"
	if !strings.Contains(raw, mounted) {
		t.Fatalf("the config does not read the keys from %s", mounted)
	}
	cfg, err := config.Parse("configmap.yaml", []byte(strings.ReplaceAll(raw, mounted, keysPath)), nil)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.NATS.URL == "" || cfg.NATS.Replicas != 3 {
		t.Errorf("nats: url %q, replicas %d; want an external cluster with 3", cfg.NATS.URL, cfg.NATS.Replicas)
	}
	if cfg.Redis.URL == "" {
		t.Error("no redis.url: the Deployment runs more than one replica")
	}

	ccfg, err := config.Parse("compose/throttler.yaml", mustRead(t, "compose/throttler.yaml"), nil)
	if err != nil {
		t.Fatal(err)
	}
	if ccfg.NATS.Replicas != 1 {
		t.Errorf("compose: nats.replicas %d on its one NATS server", ccfg.NATS.Replicas)
	}
}

func mustRead(t *testing.T, path string) []byte {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return raw
}
