package queue

import (
	"errors"
	"strconv"
	"strings"
	"testing"

	"github.com/throttler/throttler/internal/dest"
)

// unescapeBytes is escapeBytes undone.
func unescapeBytes(s string) (string, bool) {
	var b []byte
	for i := 0; i < len(s); i++ {
		if s[i] != '\\' {
			b = append(b, s[i])
			continue
		}
		switch {
		case i+1 < len(s) && s[i+1] == '\\':
			b = append(b, '\\')
			i++
		case i+3 < len(s) && s[i+1] == 'x':
			n, err := strconv.ParseUint(s[i+2:i+4], 16, 8)
			if err != nil {
				return "", false
			}
			b = append(b, byte(n))
			i += 3
		default:
			return "", false
		}
	}
	return string(b), true
}

func TestEscapeBytes(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"", ""},
		{"k", "k"},
		{"k\x7f", `k\x7f`},
		{"a b\x00\r\n", `a\x20b\x00\x0d\x0a`},
		{`a\x7f`, `a\\x7f`},
		{"é", `\xc3\xa9`},
	} {
		if got := escapeBytes(tc.in); got != tc.want {
			t.Errorf("escapeBytes(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

// FuzzEscapeBytes: the escaped form is visible ASCII only (a valid header
// value, one line of a log) and says exactly which bytes the input held.
func FuzzEscapeBytes(f *testing.F) {
	for _, s := range []string{"", "k", "k\x7f", `a\x7f`, "a b\r\n", "é\\"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		e := escapeBytes(s)
		for i := 0; i < len(e); i++ {
			if c := e[i]; c <= ' ' || c > '~' {
				t.Fatalf("escapeBytes(%q) = %q holds byte 0x%02x", s, e, c)
			}
		}
		if back, ok := unescapeBytes(e); !ok || back != s {
			t.Fatalf("escapeBytes(%q) = %q reads back as %q (%v)", s, e, back, ok)
		}
	})
}

// TestURLKey: on a url_host lane (LaneSpec.URLKey) a public job's
// Throttle-URL gives it its key; a URL the lane refuses, or a subject key
// that is not the URL's host, makes it poison; a job without a URL keeps
// its subject's key (none: poisonReason says so, naming url_host) when
// LaneSpec.KeyWithoutURL takes it, else it is poison with that reason.
func TestURLKey(t *testing.T) {
	rules, err := dest.New(dest.Config{URL: "https://base.example/", JobURLs: []string{"https://hooks.example.com/", "http://b.example:8080/"}})
	if err != nil {
		t.Fatal(err)
	}
	spec := LaneSpec{Name: "wh", URLKey: rules.KeyOf, KeyWithoutURL: func(key string) error {
		if key == "k1" {
			return nil
		}
		return errors.New("names no URL")
	}}
	for _, step := range []struct {
		name, key, url string
		wantKey        string
		wantReason     string // a part of the reason; "" for none
	}{
		{"url only", "", "https://Hooks.Example.com/in", "hooks.example.com", ""},
		{"url with port", "", "http://b.example:8080/x", "b.example:8080", ""},
		{"key agrees", "hooks.example.com", "https://hooks.example.com/in", "hooks.example.com", ""},
		{"key disagrees", "other", "https://hooks.example.com/in", "other", "is not the host of its Throttle-URL"},
		{"url refused", "", "https://evil.example/", "", "invalid Throttle-URL"},
		{"key only", "k1", "", "k1", ""},
		{"key only, refused", "k2", "", "k2", "Throttle-Key names no URL"},
		{"key only, invalid", "a..b", "", "a..b", "invalid Throttle-Key"},
		{"neither", "", "", "", "or on throttle.wh with a Throttle-URL"},
	} {
		t.Run(step.name, func(t *testing.T) {
			job := Job{Lane: "wh", Key: step.key, Dest: dest.Request{URL: step.url}}
			reason := urlKey(spec, &job)
			if reason == "" {
				reason = poisonReason(spec, job, true)
			}
			if job.Key != step.wantKey || (step.wantReason == "") != (reason == "") || !strings.Contains(reason, step.wantReason) {
				t.Errorf("key %q, reason %q; want key %q, reason with %q", job.Key, reason, step.wantKey, step.wantReason)
			}
		})
	}
	// A lane without URLKey: a public job's URL says nothing of its key.
	job := Job{Lane: "wh", Dest: dest.Request{URL: "https://hooks.example.com/in"}}
	if r := urlKey(LaneSpec{Name: "wh"}, &job); r != "" || job.Key != "" {
		t.Errorf("no URLKey: key %q, reason %q", job.Key, r)
	}
}

// TestReplayKeyReason: a dead letter's job is replayed only with a key
// its lane's key rules take: none on a plain lane or a valid one; on a
// keyed lane a valid one, or on a url_host lane the host of its URL
// (given, or taken from the URL), or a key the lane takes without a URL.
func TestReplayKeyReason(t *testing.T) {
	rules, err := dest.New(dest.Config{URL: "https://base.example/", JobURLs: []string{"https://hooks.example.com/"}})
	if err != nil {
		t.Fatal(err)
	}
	urlHost := LaneSpec{Name: "wh", URLKey: rules.KeyOf, KeyWithoutURL: func(key string) error {
		if key == "k1" {
			return nil
		}
		return errors.New("names no URL")
	}}
	plain := LaneSpec{Name: "wh"}
	for _, step := range []struct {
		name       string
		spec       LaneSpec
		keyed      bool
		key, url   string
		wantKey    string
		wantReason string // a part of the reason; "" for none
	}{
		{"plain, no key", plain, false, "", "", "", ""},
		{"plain, a key", plain, false, "k", "", "k", ""},
		{"plain, an invalid key", plain, false, `k\x7f`, "", `k\x7f`, `the job's Throttle-Key k\\x7f is not a valid key`},
		{"keyed, no key", plain, true, "", "", "", "the job has no Throttle-Key; lane wh is keyed"},
		{"keyed, a key", plain, true, "k", "", "k", ""},
		{"keyed, an invalid key", plain, true, "a/b", "", "a/b", "is not a valid key"},
		{"url_host, neither", urlHost, true, "", "", "", "no Throttle-Key and no Throttle-URL whose host would be its key"},
		{"url_host, url only", urlHost, true, "", "https://hooks.example.com/in", "hooks.example.com", ""},
		{"url_host, the url's host", urlHost, true, "hooks.example.com", "https://hooks.example.com/in", "hooks.example.com", ""},
		{"url_host, another key", urlHost, true, "other", "https://hooks.example.com/in", "other", "is not the host of its Throttle-URL"},
		{"url_host, a url refused", urlHost, true, "", "https://evil.example/", "", "invalid Throttle-URL"},
		{"url_host, a key taken without url", urlHost, true, "k1", "", "k1", ""},
		{"url_host, a key refused without url", urlHost, true, "k2", "", "k2", "names no URL"},
	} {
		t.Run(step.name, func(t *testing.T) {
			job := Job{Lane: "wh", Key: step.key, Dest: dest.Request{URL: step.url}}
			reason := replayKeyReason(step.spec, &job, step.keyed)
			if job.Key != step.wantKey || (step.wantReason == "") != (reason == "") || !strings.Contains(reason, step.wantReason) {
				t.Errorf("key %q, reason %q; want key %q, reason with %q", job.Key, reason, step.wantKey, step.wantReason)
			}
		})
	}
}
