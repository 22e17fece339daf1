package main

import (
	"bytes"
	"context"
	"os"
	"regexp"
	"strings"
	"testing"
)

// TestCLIDocsNameEveryFlag: docs/CLI.md names every command of the
// usage and every flag each command's --help lists.
func TestCLIDocsNameEveryFlag(t *testing.T) {
	raw, err := os.ReadFile("../../docs/CLI.md")
	if err != nil {
		t.Fatal(err)
	}
	doc := string(raw)
	for _, c := range regexp.MustCompile(`(?m)^  throttler ([a-z]+)`).FindAllStringSubmatch(usage, -1) {
		if !strings.Contains(doc, "`"+c[1]) && !strings.Contains(doc, "throttler "+c[1]) {
			t.Errorf("docs/CLI.md does not name the command %s", c[1])
		}
	}
	flagLine := regexp.MustCompile(`(?m)^  -([a-z][a-z-]*)`)
	n := 0
	for _, args := range [][]string{{"serve"}, {"sink"}, {"lanes"}, {"lane", "set"}, {"lane", "pause"}, {"dead", "ls"},
		{"dead", "show"}, {"dead", "replay"}, {"dead", "purge"}, {"keys"}, {"keys", "set"}, {"job"}, {"job", "cancel"}, {"health"}} {
		var out bytes.Buffer
		run(context.Background(), append(args, "--help"), func(string) string { return "" }, &out, &out)
		for _, f := range flagLine.FindAllStringSubmatch(out.String(), -1) {
			n++
			if !strings.Contains(doc, "--"+f[1]) {
				t.Errorf("docs/CLI.md does not name %s --%s", strings.Join(args, " "), f[1])
			}
		}
	}
	if n < 30 {
		t.Fatalf("only %d flags found in the --help texts; the scan is broken", n)
	}
}
