package ingest

import (
	"bytes"
	"errors"
	"io"
	"strings"
	"testing"
	"testing/iotest"
)

// TestReadExactly: readExactly reads the Content-Length's n bytes however
// the reader splits them, a shorter body is io.ErrUnexpectedEOF, and it
// reads nothing past n: net/http ends a request's body there, so a reader
// that goes on is not asked for more.
func TestReadExactly(t *testing.T) {
	for _, c := range []struct {
		name string
		r    io.Reader
		n    int64
		want string
		err  error
	}{
		{"exact", strings.NewReader("abcdef"), 6, "abcdef", nil},
		{"one byte a read", iotest.OneByteReader(strings.NewReader("abcdef")), 6, "abcdef", nil},
		{"data with EOF", iotest.DataErrReader(strings.NewReader("abcdef")), 6, "abcdef", nil},
		{"empty", strings.NewReader(""), 0, "", nil},
		{"short", strings.NewReader("abc"), 6, "", io.ErrUnexpectedEOF},
		{"none", strings.NewReader(""), 2, "", io.ErrUnexpectedEOF},
		{"more behind", strings.NewReader("abcdefgh"), 6, "abcdef", nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, err := readExactly(c.r, c.n)
			if !errors.Is(err, c.err) || (c.err == nil && !bytes.Equal(got, []byte(c.want))) {
				t.Fatalf("readExactly: %q %v, want %q %v", got, err, c.want, c.err)
			}
		})
	}
}
