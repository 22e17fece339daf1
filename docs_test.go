package throttler_test

import (
	"fmt"
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
	src := goSources(t, ".go")
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

// markdownFiles lists the repository's markdown files: the README, docs/
// and deploy/.
func markdownFiles(t *testing.T) []string {
	t.Helper()
	var files []string
	for _, glob := range []string{"*.md", "docs/*.md", "deploy/*.md"} {
		found, err := filepath.Glob(glob)
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, found...)
	}
	if len(files) < 10 {
		t.Fatalf("found %d markdown files, want README.md and docs/*.md at least", len(files))
	}
	return files
}

// proseLines returns a markdown file's lines outside fenced code blocks,
// with their numbers (from 1); fenced lines are returned empty, so that
// numbers stay those of the file.
func proseLines(text string) []string {
	lines := strings.Split(text, "\n")
	fenced := false
	for i, l := range lines {
		if strings.HasPrefix(strings.TrimSpace(l), "```") {
			fenced = !fenced
			lines[i] = ""
			continue
		}
		if fenced {
			lines[i] = ""
		}
	}
	return lines
}

var (
	inlineCode  = regexp.MustCompile("`[^`]*`")
	mdLink      = regexp.MustCompile(`\]\(([^)\s]+)\)`)
	headingLine = regexp.MustCompile(`^#{1,6} +(.+?) *#*$`)
	slugDrop    = regexp.MustCompile(`[^\p{L}\p{N} _-]`)
	linkText    = regexp.MustCompile(`\[([^\]]*)\]\([^)]*\)`)
)

// anchors returns the anchors GitHub makes for a markdown file's headings:
// the heading's text lower-cased, without markup and punctuation (hyphens
// and underscores stay), spaces turned into hyphens, and -1, -2 … after a
// repeated one.
func anchors(text string) map[string]bool {
	out := map[string]bool{}
	seen := map[string]int{}
	for _, l := range proseLines(text) {
		m := headingLine.FindStringSubmatch(l)
		if m == nil {
			continue
		}
		h := m[1]
		h = linkText.ReplaceAllString(h, "$1") // a link: its text
		h = strings.NewReplacer("`", "", "*", "").Replace(h)
		slug := strings.ReplaceAll(slugDrop.ReplaceAllString(strings.ToLower(h), ""), " ", "-")
		if n := seen[slug]; n > 0 {
			out[fmt.Sprintf("%s-%d", slug, n)] = true
		} else {
			out[slug] = true
		}
		seen[slug]++
	}
	return out
}

// TestDocLinksResolve: every relative link in the README, docs/ and
// deploy/ names a file or directory that exists, and every #anchor a
// heading of the markdown file it points into. Moving a section from one
// page to another must take its links along.
func TestDocLinksResolve(t *testing.T) {
	t.Parallel()
	texts := map[string]string{}
	read := func(path string) (string, bool) {
		if s, ok := texts[path]; ok {
			return s, true
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return "", false
		}
		texts[path] = string(b)
		return texts[path], true
	}
	links := 0
	for _, file := range markdownFiles(t) {
		text, ok := read(file)
		if !ok {
			t.Fatalf("cannot read %s", file)
		}
		for i, l := range proseLines(text) {
			for _, m := range mdLink.FindAllStringSubmatch(inlineCode.ReplaceAllString(l, ""), -1) {
				target := m[1]
				if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
					continue
				}
				links++
				path, anchor, _ := strings.Cut(target, "#")
				dest := file
				if path != "" {
					dest = filepath.Join(filepath.Dir(file), filepath.FromSlash(path))
					if _, err := os.Stat(dest); err != nil {
						t.Errorf("%s:%d: link %q: %s does not exist", file, i+1, target, dest)
						continue
					}
				}
				if anchor == "" {
					continue
				}
				if !strings.HasSuffix(dest, ".md") {
					t.Errorf("%s:%d: link %q: an anchor into %s, which is not markdown", file, i+1, target, dest)
					continue
				}
				destText, ok := read(dest)
				if !ok {
					t.Errorf("%s:%d: link %q: cannot read %s", file, i+1, target, dest)
					continue
				}
				if !anchors(destText)[anchor] {
					t.Errorf("%s:%d: link %q: %s has no heading with the anchor #%s", file, i+1, target, dest, anchor)
				}
			}
		}
	}
	if links < 50 {
		t.Fatalf("found %d relative links; the scan is broken", links)
	}
}

// TestDocsNameRealTests: every test a markdown file names in backticks
// (`TestX`) exists, as a top-level func or a subtest, so that no page
// points at a test that was renamed or deleted.
func TestDocsNameRealTests(t *testing.T) {
	t.Parallel()
	src := goSources(t, "_test.go")
	name := regexp.MustCompile("`(Test[A-Z][A-Za-z0-9_]*)`")
	named := 0
	for _, file := range markdownFiles(t) {
		b, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		for i, l := range strings.Split(string(b), "\n") {
			for _, m := range name.FindAllStringSubmatch(l, -1) {
				named++
				if !strings.Contains(src, "func "+m[1]+"(") && !strings.Contains(src, `t.Run("`+m[1]+`"`) {
					t.Errorf("%s:%d: names %s, but no test has that name", file, i+1, m[1])
				}
			}
		}
	}
	if named < 50 {
		t.Fatalf("found %d test names in the docs; the scan is broken", named)
	}
}

// goSources returns the text of every file of the module whose name ends in
// suffix (".go", "_test.go"), outside .git, testdata and node_modules.
func goSources(t *testing.T, suffix string) string {
	t.Helper()
	var sources strings.Builder
	err := filepath.WalkDir(".", func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == ".git" || d.Name() == "testdata" || d.Name() == "node_modules") {
			return filepath.SkipDir
		}
		if strings.HasSuffix(path, suffix) {
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
	return sources.String()
}
