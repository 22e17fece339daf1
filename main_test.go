package throttler_test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	// The recipe tests run this binary as the nats command line tool.
	if filepath.Base(os.Args[0]) == "nats" {
		os.Exit(natsCLI(os.Args[1:], os.Stderr))
	}
	code := m.Run()
	if built.dir != "" {
		os.RemoveAll(built.dir)
	}
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// built is the throttler binary, built once for the tests that run it.
var built struct {
	once sync.Once
	dir  string
	path string
	err  error
}

// throttlerBinary builds ./cmd/throttler once per test run and returns its
// path.
func throttlerBinary(t *testing.T) string {
	t.Helper()
	built.once.Do(func() {
		if built.dir, built.err = os.MkdirTemp("", "throttler-bin"); built.err != nil {
			return
		}
		built.path = filepath.Join(built.dir, "throttler")
		if out, err := exec.Command("go", "build", "-o", built.path, "./cmd/throttler").CombinedOutput(); err != nil {
			built.err = fmt.Errorf("go build ./cmd/throttler: %w\n%s", err, out)
		}
	})
	if built.err != nil {
		t.Fatal(built.err)
	}
	return built.path
}
