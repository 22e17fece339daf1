package testenv

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"
)

// throttlerPkg is the service's main package.
const throttlerPkg = "github.com/throttler/throttler/cmd/throttler"

// binaryKeep is how long a cached throttler binary that no test run asked
// for stays in the cache directory: each change of the sources builds a
// new one, and the old ones would pile up.
const binaryKeep = 24 * time.Hour

// throttlerBin is the throttler binary, looked up (and built when missing)
// once per test binary.
var throttlerBin struct {
	once sync.Once
	path string
	err  error
}

// ThrottlerBinary returns the path of the throttler service binary built
// from the sources of the module the test runs in (`go build
// -buildvcs=false ./cmd/throttler`: no version or revision stamped in, as
// one binary serves every commit with the same sources). It is built once per content
// of those sources: the binary goes to the user's cache directory
// (os.TempDir when there is none) under a name keyed by a hash of every
// file the build reads in this module (Go files, embedded files, go.mod,
// go.sum) and the toolchain and target, so that the test packages of one
// `go test ./...` run, and later runs on unchanged sources, share one link
// instead of one each. Building needs the go command on PATH; a failure
// fails t. Safe for concurrent use; binaries nobody asked for in a day are
// removed.
func ThrottlerBinary(t testing.TB) string {
	t.Helper()
	bin, err := ThrottlerBinaryPath()
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	return bin
}

// ThrottlerBinaryPath is ThrottlerBinary for a TestMain: it returns the
// error instead of failing a test.
func ThrottlerBinaryPath() (string, error) {
	throttlerBin.once.Do(func() {
		throttlerBin.path, throttlerBin.err = buildThrottler()
	})
	return throttlerBin.path, throttlerBin.err
}

// LocalBin returns a directory holding throttler (ThrottlerBinary) and
// nats-server (NATSServerBinary), as deploy/local's scripts would build them
// into their bin directory, for a run with FLEET_PREBUILT or
// CLUSTER_PREBUILT set: the scripts then start the binaries the tests share
// instead of linking their own. A failure fails t.
func LocalBin(t testing.TB) string {
	t.Helper()
	dir := t.TempDir()
	for name, path := range map[string]string{"throttler": ThrottlerBinary(t), "nats-server": NATSServerBinary(t)} {
		if err := os.Symlink(path, filepath.Join(dir, name)); err != nil {
			t.Fatalf("testenv: %v", err)
		}
	}
	return dir
}

// NATSServerBinary returns the path of a nats-server executable built from
// the nats-server module in go.mod (once per machine and version; see
// StartNATSCluster). A failure fails t.
func NATSServerBinary(t testing.TB) string {
	t.Helper()
	bin, err := natsServerBinary()
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	return bin
}

func buildThrottler() (string, error) {
	goBin, err := exec.LookPath("go")
	if err != nil {
		return "", fmt.Errorf("building %s needs the go command on PATH: %w", throttlerPkg, err)
	}
	key, err := sourceKey(goBin, "", throttlerPkg)
	if err != nil {
		return "", fmt.Errorf("build %s: %w", throttlerPkg, err)
	}
	cache, err := os.UserCacheDir()
	if err != nil {
		cache = os.TempDir()
	}
	dir := filepath.Join(cache, "throttler-testenv")
	bin := filepath.Join(dir, "throttler-"+key)
	if _, err := os.Stat(bin); err == nil {
		// Used now: pruneBinaries keeps it.
		now := time.Now()
		os.Chtimes(bin, now, now)
		return bin, nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("build %s: %w", throttlerPkg, err)
	}
	// One build at a time: a test binary that finds another one
	// building waits, then finds the binary.
	unlock, err := lockFile(filepath.Join(dir, "throttler.lock"))
	if err != nil {
		return "", fmt.Errorf("build %s: lock: %w", throttlerPkg, err)
	}
	defer unlock()
	if _, err := os.Stat(bin); err == nil {
		return bin, nil
	}
	// A temporary name, then a rename: test binaries of several packages
	// may build at the same time, and none must run a half-written file.
	tmp, err := os.CreateTemp(dir, "throttler-build-")
	if err != nil {
		return "", fmt.Errorf("build %s: %w", throttlerPkg, err)
	}
	tmp.Close()
	defer os.Remove(tmp.Name())
	if out, err := exec.Command(goBin, "build", "-buildvcs=false", "-o", tmp.Name(), throttlerPkg).CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build %s: %w: %s", throttlerPkg, err, strings.TrimSpace(string(out)))
	}
	if err := os.Rename(tmp.Name(), bin); err != nil {
		return "", fmt.Errorf("build %s: %w", throttlerPkg, err)
	}
	pruneBinaries(dir, bin)
	return bin, nil
}

// sourceKey hashes what `go build pkg` reads from the main module of dir
// ("": the current directory): the
// names and contents of every Go, assembly, C and embedded file of pkg and
// of its dependencies in the module, go.mod and go.sum (which pin every
// other module), with the go version and the build environment (GOOS,
// GOARCH, CGO_ENABLED, GOFLAGS, GOEXPERIMENT).
func sourceKey(goBin, dir, pkg string) (string, error) {
	h := sha256.New()
	goEnv := exec.Command(goBin, "env", "GOVERSION", "GOOS", "GOARCH", "CGO_ENABLED", "GOFLAGS", "GOEXPERIMENT", "GOMOD")
	goEnv.Dir = dir
	env, err := goEnv.Output()
	if err != nil {
		return "", fmt.Errorf("go env: %w", err)
	}
	h.Write(env)
	lines := strings.Split(strings.TrimSpace(string(env)), "\n")
	gomod := lines[len(lines)-1]
	if gomod == "" || gomod == os.DevNull {
		return "", fmt.Errorf("the test does not run inside a module (go env GOMOD is %q)", gomod)
	}
	root := filepath.Dir(gomod)
	files := []string{filepath.Join(root, "go.mod"), filepath.Join(root, "go.sum")}
	const format = `{{if and .Module .Module.Main}}{{$d := .Dir}}` +
		`{{range .GoFiles}}{{$d}}/{{.}}{{"\n"}}{{end}}{{range .CgoFiles}}{{$d}}/{{.}}{{"\n"}}{{end}}` +
		`{{range .SFiles}}{{$d}}/{{.}}{{"\n"}}{{end}}{{range .CFiles}}{{$d}}/{{.}}{{"\n"}}{{end}}` +
		`{{range .HFiles}}{{$d}}/{{.}}{{"\n"}}{{end}}{{range .SysoFiles}}{{$d}}/{{.}}{{"\n"}}{{end}}` +
		`{{range .EmbedFiles}}{{$d}}/{{.}}{{"\n"}}{{end}}{{end}}`
	cmd := exec.Command(goBin, "list", "-deps", "-f", format, pkg)
	cmd.Dir = root
	out, err := cmd.Output()
	if err != nil {
		if exit, ok := err.(*exec.ExitError); ok {
			return "", fmt.Errorf("go list -deps %s: %w: %s", pkg, err, strings.TrimSpace(string(exit.Stderr)))
		}
		return "", fmt.Errorf("go list -deps %s: %w", pkg, err)
	}
	files = append(files, strings.Fields(string(out))...)
	for _, name := range files {
		rel, err := filepath.Rel(root, name)
		if err != nil {
			rel = name
		}
		fmt.Fprintf(h, "%s\x00", rel)
		f, err := os.Open(name)
		if os.IsNotExist(err) && rel == "go.sum" {
			continue // a module without dependencies
		}
		if err != nil {
			return "", err
		}
		_, err = io.Copy(h, f)
		f.Close()
		if err != nil {
			return "", fmt.Errorf("read %s: %w", name, err)
		}
		h.Write([]byte{0})
	}
	return fmt.Sprintf("%s-%s-%s", hex.EncodeToString(h.Sum(nil))[:20], runtime.GOOS, runtime.GOARCH), nil
}

// pruneBinaries removes the cached throttler binaries other than keep that
// no test run has asked for in binaryKeep. A binary being run when it is
// removed runs on (the file goes when the last process closes it).
func pruneBinaries(dir, keep string) {
	matches, _ := filepath.Glob(filepath.Join(dir, "throttler-*"))
	for _, m := range matches {
		if m == keep || strings.HasPrefix(filepath.Base(m), "throttler-build-") || strings.HasSuffix(m, ".lock") {
			continue
		}
		if fi, err := os.Stat(m); err == nil && time.Since(fi.ModTime()) > binaryKeep {
			os.Remove(m)
		}
	}
}
