package testenv

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// TestSourceKey: the key of a build changes with any file the build reads
// (a Go file of the package or of a package it imports from the module,
// an embedded file, go.mod) and with nothing else (a test file, a package
// it does not import).
func TestSourceKey(t *testing.T) {
	t.Parallel()
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Fatal("the go command is not on PATH")
	}
	dir := t.TempDir()
	write := func(name, text string) {
		t.Helper()
		path := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("go.mod", "module example.com/m\n\ngo 1.22\n")
	write("cmd/m/main.go", "package main\n\nimport _ \"example.com/m/lib\"\n\nfunc main() {}\n")
	write("lib/lib.go", "package lib\n\nimport _ \"embed\"\n\n//go:embed page.html\nvar Page string\n")
	write("lib/page.html", "<p>one</p>\n")
	write("other/other.go", "package other\n")
	key := func() string {
		t.Helper()
		k, err := sourceKey(goBin, dir, "./cmd/m")
		if err != nil {
			t.Fatal(err)
		}
		return k
	}
	seen := map[string]string{}
	prev := key()
	if again := key(); again != prev {
		t.Fatalf("two keys of the same sources: %s, %s", prev, again)
	}
	seen[prev] = "the start"
	for _, step := range []struct {
		what, name, text string
		changes          bool
	}{
		{"a test file", "lib/lib_test.go", "package lib\n", false},
		{"a package not imported", "other/other.go", "package other\n\nvar X = 1\n", false},
		{"the main package", "cmd/m/main.go", "package main\n\nimport _ \"example.com/m/lib\"\n\nfunc main() { println() }\n", true},
		{"an imported package", "lib/lib.go", "package lib\n\nimport _ \"embed\"\n\n//go:embed page.html\nvar Page string\n\nvar Y = 2\n", true},
		{"an embedded file", "lib/page.html", "<p>two</p>\n", true},
		{"go.mod", "go.mod", "module example.com/m\n\ngo 1.23\n", true},
	} {
		write(step.name, step.text)
		k := key()
		switch {
		case step.changes && k == prev:
			t.Errorf("%s changed (%s): the key stayed", step.what, step.name)
		case step.changes && seen[k] != "":
			t.Errorf("%s changed (%s): the key went back to that of %s", step.what, step.name, seen[k])
		case !step.changes && k != prev:
			t.Errorf("%s changed (%s): the key changed", step.what, step.name)
		}
		seen[k] = step.what
		prev = k
	}
}

// TestThrottlerBinary: the binary runs, and a second call (of this or any
// later test binary) finds it without building.
func TestThrottlerBinary(t *testing.T) {
	t.Parallel()
	bin := ThrottlerBinary(t)
	out, err := exec.Command(bin, "version").CombinedOutput()
	if err != nil {
		t.Fatalf("%s version: %v\n%s", bin, err, out)
	}
	before, err := os.Stat(bin)
	if err != nil {
		t.Fatal(err)
	}
	again, err := buildThrottler()
	if err != nil || again != bin {
		t.Fatalf("a second lookup: %s %v, want %s", again, err, bin)
	}
	// A build would have renamed a new file over it.
	if after, err := os.Stat(bin); err != nil || !os.SameFile(before, after) {
		t.Fatalf("a second lookup built again (%v)", err)
	}
}
