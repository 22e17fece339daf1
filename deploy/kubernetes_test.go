package deploy

import (
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
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
			if _, dup := out[kind]; dup {
				// A second of a kind (the metrics token Secret) by
				// kind/name; the first (by file name) keeps the kind.
				name, _ := dig(t, doc, "metadata", "name").(string)
				out[kind+"/"+name] = doc
				continue
			}
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
	// GOMEMLIMIT is at most 90 % of the memory limit: the whole limit
	// leaves the runtime no room before the OOM killer.
	limit := quantityBytes(t, dig(t, res, "limits", "memory").(string))
	gomem := int64(0)
	for _, e := range dig(t, c, "env").([]any) {
		e := e.(map[string]any)
		if e["name"] == "GOMEMLIMIT" {
			v, _ := e["value"].(string)
			if v == "" {
				t.Fatalf("GOMEMLIMIT is not a plain value (%v); a resourceFieldRef is the whole limit", e)
			}
			gomem = quantityBytes(t, strings.TrimSuffix(v, "B"))
		}
	}
	if gomem == 0 || gomem > limit*9/10 {
		t.Errorf("GOMEMLIMIT is %d bytes, limits.memory %d: want set, at most 90%% of the limit", gomem, limit)
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

// quantityBytes reads a memory quantity as Kubernetes and GOMEMLIMIT write
// it: a number with Ki, Mi or Gi (GOMEMLIMIT's KiB, MiB, GiB without the B).
func quantityBytes(t *testing.T, q string) int64 {
	t.Helper()
	for suffix, mul := range map[string]int64{"Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30} {
		if n, ok := strings.CutSuffix(q, suffix); ok {
			v, err := strconv.ParseInt(n, 10, 64)
			if err != nil {
				t.Fatalf("quantity %q: %v", q, err)
			}
			return v * mul
		}
	}
	t.Fatalf("quantity %q: want Ki, Mi or Gi", q)
	return 0
}

// TestReferencedSecretsAreApplied: every Secret the Deployment and the
// ServiceMonitor name (unless optional) is one the kustomization applies:
// a reference to a Secret nobody creates leaves pods pending or Prometheus
// without its token.
func TestReferencedSecretsAreApplied(t *testing.T) {
	m := manifests(t)
	applied := map[string]bool{}
	for kind, doc := range m {
		if kind == "Secret" || strings.HasPrefix(kind, "Secret/") {
			applied[dig(t, doc, "metadata", "name").(string)] = true
		}
	}
	var k struct {
		Resources []string `yaml:"resources"`
	}
	raw, err := os.ReadFile("kubernetes/kustomization.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(raw, &k); err != nil {
		t.Fatal(err)
	}
	files, _ := filepath.Glob("kubernetes/secret-*.yaml")
	for _, f := range files {
		if !slices.Contains(k.Resources, filepath.Base(f)) {
			t.Errorf("%s is not in kustomization.yaml's resources", f)
		}
	}
	need := []string{dig(t, m["ServiceMonitor"], "spec", "endpoints", 0, "authorization", "credentials", "name").(string)}
	for _, v := range dig(t, m["Deployment"], "spec", "template", "spec", "volumes").([]any) {
		if s, ok := v.(map[string]any)["secret"].(map[string]any); ok && s["optional"] != true {
			need = append(need, s["secretName"].(string))
		}
	}
	for _, name := range need {
		if !applied[name] {
			t.Errorf("Secret %s is referenced but no manifest of the kustomization creates it", name)
		}
	}
}

// TestComposeThrottlersHaveHealthChecks: every throttler service of the
// Compose files has a health check, run by the binary itself at the path
// the Dockerfile installs it (the image has no shell, curl or wget).
func TestComposeThrottlersHaveHealthChecks(t *testing.T) {
	docker, err := os.ReadFile("Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	const bin = "/usr/local/bin/throttler"
	if !strings.Contains(string(docker), `ENTRYPOINT ["`+bin+`"]`) {
		t.Fatalf("the Dockerfile's entrypoint is not %s", bin)
	}
	n := 0
	for _, f := range []string{"compose/docker-compose.yml", "compose/cluster.yml"} {
		var c struct {
			Services map[string]struct {
				Image       string `yaml:"image"`
				Command     []string
				Healthcheck struct {
					Test []string `yaml:"test"`
				} `yaml:"healthcheck"`
			} `yaml:"services"`
		}
		readYAML(t, f, &c)
		for name, s := range c.Services {
			if !strings.HasPrefix(s.Image, "throttler:") || len(s.Command) == 0 || s.Command[0] != "serve" {
				continue
			}
			n++
			if test := s.Healthcheck.Test; len(test) < 3 || test[0] != "CMD" || test[1] != bin || test[2] != "health" {
				t.Errorf("%s: service %s: health check %q, want [CMD %s health …]", f, name, test, bin)
			}
		}
	}
	if n < 4 {
		t.Fatalf("only %d throttler services found; the scan is broken", n)
	}
}
