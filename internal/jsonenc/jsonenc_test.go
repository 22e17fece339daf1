package jsonenc

import (
	"bytes"
	"encoding/json"
	"testing"
)

// FuzzAppendString: AppendString writes exactly what encoding/json writes
// for the same string, after any prefix already in the buffer, and
// StringLen says its length.
func FuzzAppendString(f *testing.F) {
	for _, s := range []string{
		"", "plain", `a"b\c`, "<script>&</script>", "tab\tnl\ncr\r\b\f\x00\x1f",
		"é", "<é", `"é`, `\é`, "\x01é", "a<b>c&d\"e\\fé🚀", "🚀<",
		"\xff", "<\xff", "a\xc3", "\u2028<\u2029", "ok<\x7f>é\xe2\x82",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		want, err := json.Marshal(s)
		if err != nil {
			t.Fatalf("encoding/json: %v", err)
		}
		got := AppendString([]byte(`{"x":`), s)
		if !bytes.Equal(got, append([]byte(`{"x":`), want...)) {
			t.Fatalf("AppendString(%q)\n got %s\nwant {\"x\":%s", s, got, want)
		}
		if n := StringLen(s); n != len(want) {
			t.Fatalf("StringLen(%q) = %d, want %d", s, n, len(want))
		}
	})
}

func BenchmarkAppendString(b *testing.B) {
	buf := make([]byte, 0, 64)
	for b.Loop() {
		buf = AppendString(buf[:0], "order-12345 <lane>")
	}
}
