package throttler_test

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestDocsGuaranteesNameRealTests: every test that docs/DESIGN.md's table
// "Guarantees and their tests" names exists (a top-level func TestX, or a
// subtest t.Run("X", …)), and every guarantee row names at least one. A
// renamed or deleted test would otherwise leave a guarantee that nothing
// holds while the table still says it is held.
func TestDocsGuaranteesNameRealTests(t *testing.T) {
	t.Parallel()
	design, err := os.ReadFile("docs/DESIGN.md")
	if err != nil {
		t.Fatal(err)
	}
	doc := string(design)
	start := strings.Index(doc, "## Guarantees and their tests")
	if start < 0 {
		t.Fatal(`docs/DESIGN.md has no "## Guarantees and their tests" section`)
	}
	table := doc[start:]
	if end := strings.Index(table[3:], "\n## "); end >= 0 {
		table = table[:end+3]
	}
	var sources strings.Builder
	err = filepath.WalkDir(".", func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == ".git" || d.Name() == "testdata" || d.Name() == "node_modules") {
			return filepath.SkipDir
		}
		if strings.HasSuffix(path, ".go") {
			b, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			sources.Write(b)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	src := sources.String()
	name := regexp.MustCompile("`(Test[A-Za-z0-9_]*|[A-Z][A-Za-z0-9]*(?:Under|Of|Is)[A-Za-z0-9]*)`")
	rows := 0
	for _, line := range strings.Split(table, "\n") {
		cells := strings.Split(line, "|")
		if len(cells) < 5 || !strings.HasPrefix(strings.TrimSpace(line), "|") || strings.Contains(line, "---") || strings.Contains(line, "guarantee") {
			continue
		}
		rows++
		tests := name.FindAllStringSubmatch(cells[3], -1)
		if len(tests) == 0 {
			t.Errorf("guarantee %q names no test", strings.TrimSpace(cells[2]))
		}
		for _, m := range tests {
			n := m[1]
			if !strings.Contains(src, "func "+n+"(") && !strings.Contains(src, `t.Run("`+n+`"`) {
				t.Errorf("docs/DESIGN.md names %s for %q, but no test has that name", n, strings.TrimSpace(cells[2]))
			}
		}
	}
	if rows < 6 {
		t.Fatalf("found %d guarantee rows in docs/DESIGN.md, want G1–G6 at least", rows)
	}
}
