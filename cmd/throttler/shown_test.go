package main

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/throttler/throttler/api"
)

// TestTargetTextCannotDriveTheTerminal: what a target answered reaches the
// operator's terminal through `throttler job` (the body, the kept headers)
// and `throttler dead show` (the status text in the last error, the
// payload); an escape sequence in it is printed escaped, never as the
// control characters a terminal acts on.
func TestTargetTextCannotDriveTheTerminal(t *testing.T) {
	const evil = "ok \x1b]0;title\x07 \x1b[2J \u009b31m \x7f \xff"
	now := time.Date(2026, 12, 6, 3, 0, 0, 0, time.UTC)
	rec := &api.JobRecord{ID: "j1", Lane: "demo", State: api.StateDelivered, StoredAt: &now, Reason: evil,
		Attempts: []api.JobAttempt{{At: now, Error: evil}},
		Response: &api.JobResponse{Status: 200, Headers: map[string]string{"X-Evil": evil}, Body: evil}}
	dead := &api.DeadLetter{Seq: 1, ID: "j1", Lane: "demo", Reason: evil, LastStatus: 400,
		LastError: "dispatch: POST http://t/hook: target answered 400 " + evil, DeadAt: now,
		Payload: []byte("a\u009b31mb")}
	for _, c := range []struct {
		name  string
		print func(*bytes.Buffer)
	}{
		{"job", func(b *bytes.Buffer) { printRecord(b, rec) }},
		{"dead show", func(b *bytes.Buffer) { printDead(b, dead) }},
	} {
		t.Run(c.name, func(t *testing.T) {
			var b bytes.Buffer
			c.print(&b)
			out := b.String()
			if i := strings.IndexFunc(out, unsafeRune); i >= 0 {
				t.Errorf("printed a control character at %d:\n%q", i, out)
			}
			if strings.Contains(out, "\xff") {
				t.Errorf("printed a byte that is not UTF-8:\n%q", out)
			}
			if c.name == "job" && !strings.Contains(out, `ok \x1b]0;title\x07 \x1b[2J \u009b31m \x7f \xff`) {
				t.Errorf("the body is not shown escaped:\n%q", out)
			}
		})
	}
}

func TestShown(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"plain text, ünïcode", "plain text, ünïcode"},
		{"lines\nand\ttabs", "lines\nand\ttabs"},
		{"\x1b[31mred", `\x1b[31mred`},
		{"cr\rover", `cr\x0dover`},
		{"c1 \u009b", `c1 \u009b`},
		{"bad \xff", `bad \xff`},
	} {
		if got := shown(c.in); got != c.want {
			t.Errorf("shown(%q) = %q, want %q", c.in, got, c.want)
		}
	}
}

// TestCell: a table cell escapes what shown does, and tabs and newlines,
// which would move the columns and rows after it.
func TestCell(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"plain", "plain"},
		{"a\tb\nc", `a\tb\nc`},
		{"\x1b[2J", `\x1b[2J`},
	} {
		if got := cell(c.in); got != c.want {
			t.Errorf("cell(%q) = %q, want %q", c.in, got, c.want)
		}
	}
}

// TestDeadShowPrintsTheRequest: `throttler dead show` prints every field
// of the dead letter (docs/CLI.md), the job's request shape included:
// its method, path, URL, the names of its forwarded headers and its
// expiry.
func TestDeadShowPrintsTheRequest(t *testing.T) {
	now := time.Date(2026, 12, 6, 3, 0, 0, 0, time.UTC)
	expires := now.Add(time.Hour)
	var b bytes.Buffer
	printDead(&b, &api.DeadLetter{Seq: 7, ID: "j1", Lane: "demo", Reason: "rejected by target", Attempts: 1, DeadAt: now,
		Method: "PUT", Path: "/v2/items/42", URL: "https://api.example.com/v2/items/42?…", Headers: []string{"X-Api-Key", "X-Tenant"},
		Expires: &expires, Payload: []byte("x")})
	out := b.String()
	for _, want := range []string{"method:", "PUT", "path:", "/v2/items/42", "url:", "https://api.example.com/v2/items/42?…",
		"headers:", "X-Api-Key, X-Tenant", "expires:", "2026-12-06T04:00:00Z"} {
		if !strings.Contains(out, want) {
			t.Errorf("dead show does not print %q:\n%s", want, out)
		}
	}
}
