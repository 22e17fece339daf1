package main

import (
	"fmt"
	"io"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strings"
	"testing"

	"github.com/throttler/throttler/internal/metrics"
)

func TestResolveBuild(t *testing.T) {
	vcs := func(rev, modified string) *debug.BuildInfo {
		return &debug.BuildInfo{Main: debug.Module{Version: "v1.4.0"}, Settings: []debug.BuildSetting{
			{Key: "vcs.revision", Value: rev}, {Key: "vcs.modified", Value: modified},
		}}
	}
	gov := runtime.Version()
	for _, tc := range []struct {
		name                       string
		version, revision, changed string
		bi                         *debug.BuildInfo
		want                       metrics.Build
	}{
		{"the linker's values first", "v2.0.0", "abc123", "", vcs("def456", "true"),
			metrics.Build{Version: "v2.0.0", Revision: "abc123", GoVersion: gov}},
		{"the linker's modified", "v2.0.0", "abc123", "true", nil,
			metrics.Build{Version: "v2.0.0", Revision: "abc123-modified", GoVersion: gov}},
		{"the go tool's when the linker says nothing", "", "", "", vcs("def456", "false"),
			metrics.Build{Version: "v1.4.0", Revision: "def456", GoVersion: gov}},
		{"the go tool's modified", "", "", "", vcs("def456", "true"),
			metrics.Build{Version: "v1.4.0", Revision: "def456-modified", GoVersion: gov}},
		{"-buildvcs=false and no linker values", "", "", "", &debug.BuildInfo{Main: debug.Module{Version: "(devel)"}},
			metrics.Build{Version: "(devel)", Revision: "unknown", GoVersion: gov}},
		{"no build info at all", "", "", "true", nil,
			metrics.Build{Version: "devel", Revision: "unknown", GoVersion: gov}},
	} {
		if got := resolveBuild(tc.version, tc.revision, tc.changed, tc.bi); got != tc.want {
			t.Errorf("%s: %+v, want %+v", tc.name, got, tc.want)
		}
	}
}

// builtVersion is the VERSION given to make build.
const builtVersion = "v9.8.7-test"

// makeBuild runs `make build` into bin with VERSION=builtVersion and
// GOFLAGS=-buildvcs=false, and returns the revision it should have put
// in: the short HEAD, "-modified" when tracked files differ from it.
func makeBuild(bin string) (string, error) {
	git := func(args ...string) (string, error) {
		out, err := exec.Command("git", append([]string{"-C", "../.."}, args...)...).Output()
		if err != nil {
			return "", fmt.Errorf("git %v: %w", args, err)
		}
		return strings.TrimSpace(string(out)), nil
	}
	rev, err := git("rev-parse", "--short=12", "HEAD")
	if err != nil {
		return "", err
	}
	status, err := git("status", "--porcelain", "--untracked-files=no")
	if err != nil {
		return "", err
	}
	if status != "" {
		rev += "-modified"
	}
	mk := exec.Command("make", "-s", "-C", "../..", "build", "BIN="+bin, "VERSION="+builtVersion)
	mk.Env = append(mk.Environ(), "GOFLAGS=-buildvcs=false")
	if out, err := mk.CombinedOutput(); err != nil {
		return "", fmt.Errorf("make build: %w\n%s", err, out)
	}
	return rev, nil
}

// TestVersionOfMakeBuild: `make build` (see makeBuild) puts the version
// and the revision into the binary even with GOFLAGS=-buildvcs=false;
// `throttler version` prints them and /metrics carries them in
// throttler_build_info. Parallel: its link runs after the real-clock tests
// of the package, beside the others that only check outcomes.
func TestVersionOfMakeBuild(t *testing.T) {
	t.Parallel()
	bin := filepath.Join(t.TempDir(), "throttler")
	rev, err := makeBuild(bin)
	if err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(bin, "version").Output()
	if err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprintf("throttler %s (revision %s, %s)\n", builtVersion, rev, runtime.Version())
	if string(out) != want {
		t.Fatalf("throttler version printed %q, want %q", out, want)
	}

	path, addr := procConfig(t, t.TempDir(), "", "", laneYAML{rate: 5, burst: 2, target: "http://127.0.0.1:1/never"})
	p := startBinary(t, bin, path, addr)
	resp, err := pollClient.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	line := fmt.Sprintf(`throttler_build_info{goversion=%q,revision=%q,version=%q} 1`, runtime.Version(), rev, builtVersion)
	if !strings.Contains(string(body), line) {
		t.Errorf("/metrics lacks %s", line)
	}
	p.stop()
}
