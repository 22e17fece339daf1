package queue

import (
	"strconv"
	"testing"
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
