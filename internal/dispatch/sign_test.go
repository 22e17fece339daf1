package dispatch

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/throttler/throttler/internal/clock"
)

// verifyStandardWebhook is an independent verifier written from the
// Standard Webhooks spec: it shares no code with Signer. It reports whether
// the signature header holds a valid v1 entry for key.
func verifyStandardWebhook(t *testing.T, key []byte, id, ts string, body []byte, sigHeader string) bool {
	t.Helper()
	mac := hmac.New(sha256.New, key)
	mac.Write([]byte(id + "." + ts + "." + string(body)))
	want := mac.Sum(nil)
	for _, entry := range strings.Fields(sigHeader) {
		version, sig, ok := strings.Cut(entry, ",")
		if !ok || version != "v1" {
			continue
		}
		got, err := base64.StdEncoding.DecodeString(sig)
		if err != nil {
			t.Errorf("signature entry %q is not base64: %v", entry, err)
			continue
		}
		if hmac.Equal(got, want) {
			return true
		}
	}
	return false
}

// decodeWhsec decodes a "whsec_" secret the way the spec describes.
func decodeWhsec(t *testing.T, s string) []byte {
	t.Helper()
	b, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(s, "whsec_"))
	if err != nil {
		t.Fatalf("decode %q: %v", s, err)
	}
	return b
}

func newSecret(t *testing.T) string {
	t.Helper()
	key := make([]byte, 32)
	if _, err := rand.Read(key); err != nil {
		t.Fatal(err)
	}
	return "whsec_" + base64.StdEncoding.EncodeToString(key)
}

// TestSignerSpecVector reproduces the Standard Webhooks reference test
// vector: interoperability, not just self-consistency.
func TestSignerSpecVector(t *testing.T) {
	s, err := NewSigner([]string{"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	h := s.SignAt("msg_p5jXN8AQM9LWM0D4loKWxJek", time.Unix(1614265330, 0), []byte(`{"test": 2432232314}`))
	if got, want := h.Get(HeaderWebhookSignature), "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="; got != want {
		t.Errorf("signature = %q, want %q", got, want)
	}
	if got := h.Get(HeaderWebhookTimestamp); got != "1614265330" {
		t.Errorf("timestamp = %q", got)
	}
	if got := h.Get(HeaderWebhookID); got != "msg_p5jXN8AQM9LWM0D4loKWxJek" {
		t.Errorf("id = %q", got)
	}
}

func TestSignerRotatedSecrets(t *testing.T) {
	secrets := []string{newSecret(t), newSecret(t)}
	now := time.Unix(1700000000, 0)
	s, err := NewSigner(secrets, clock.NewManual(now))
	if err != nil {
		t.Fatal(err)
	}
	body := []byte(`{"event":"x"}`)
	h := s.Sign("job-1", body)
	if got := h.Get(HeaderWebhookTimestamp); got != "1700000000" {
		t.Fatalf("timestamp = %q", got)
	}
	sig := h.Get(HeaderWebhookSignature)
	if n := len(strings.Fields(sig)); n != 2 {
		t.Fatalf("signature header %q has %d entries, want 2", sig, n)
	}
	for i, sec := range secrets {
		if !verifyStandardWebhook(t, decodeWhsec(t, sec), "job-1", "1700000000", body, sig) {
			t.Errorf("no valid signature for secret %d in %q", i, sig)
		}
	}
	// The verifier really checks: another body, id or key fails.
	if verifyStandardWebhook(t, decodeWhsec(t, secrets[0]), "job-1", "1700000000", []byte(`{"event":"y"}`), sig) {
		t.Error("signature verified for a different body")
	}
	if verifyStandardWebhook(t, decodeWhsec(t, secrets[0]), "job-2", "1700000000", body, sig) {
		t.Error("signature verified for a different id")
	}
	if verifyStandardWebhook(t, decodeWhsec(t, newSecret(t)), "job-1", "1700000000", body, sig) {
		t.Error("signature verified for an unrelated secret")
	}
}

// TestSignerRealClock: a nil now means the real clock.
func TestSignerRealClock(t *testing.T) {
	s, err := NewSigner([]string{newSecret(t)}, nil)
	if err != nil {
		t.Fatal(err)
	}
	h := s.Sign("id", []byte("b"))
	ts, err := strconv.ParseInt(h.Get(HeaderWebhookTimestamp), 10, 64)
	if d := time.Since(time.Unix(ts, 0)); err != nil || d < -time.Second || d > time.Minute {
		t.Errorf("timestamp %q is not now (off by %v, err %v)", h.Get(HeaderWebhookTimestamp), d, err)
	}
}

// whsec returns a secret in the spec's form for n bytes of key.
func whsec(n int) string {
	key := make([]byte, n)
	for i := range key {
		key[i] = byte(i*37 + 11)
	}
	return "whsec_" + base64.StdEncoding.EncodeToString(key)
}

func TestParseSigningSecret(t *testing.T) {
	canonical := whsec(25)                          // 36 characters, "==" padded
	flipped := canonical[:len(canonical)-3] + "B==" // non-zero padding bits
	steps := []struct {
		name, secret string
		bytes        int    // key length when accepted
		want         string // part of the error when refused
	}{
		{"spec vector", "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", 24, ""},
		{"24 bytes", whsec(24), 24, ""},
		{"32 bytes", whsec(32), 32, ""},
		{"64 bytes", whsec(64), 64, ""},
		{"25 bytes padded", canonical, 25, ""},
		{"empty", "", 0, "empty"},
		{"raw secret", "a-raw-secret-that-is-long-enough-but-has-no-prefix", 0, "does not start with whsec_"},
		{"upper-case prefix", "WHSEC_" + whsec(32)[6:], 0, "does not start with whsec_"},
		{"prefix only", "whsec_", 0, "the key is 0 bytes"},
		{"23 bytes", whsec(23), 0, "the key is 23 bytes"},
		{"65 bytes", whsec(65), 0, "the key is 65 bytes"},
		{"not base64", "whsec_!!!notbase64!!!notbase64!!!notbase64", 0, "not standard base64"},
		{"url alphabet", "whsec_" + base64.URLEncoding.EncodeToString(bytes32(0xfb)), 0, "not standard base64"},
		{"unpadded", strings.TrimRight(canonical, "="), 0, "not standard base64"},
		{"newline inside", canonical[:20] + "\n" + canonical[20:], 0, "not standard base64"},
		{"space after", canonical + " ", 0, "not standard base64"},
		{"padding bits", flipped, 0, "not standard base64"},
	}
	for _, s := range steps {
		t.Run(s.name, func(t *testing.T) {
			key, err := ParseSigningSecret(s.secret)
			if s.want == "" {
				if err != nil || len(key) != s.bytes {
					t.Fatalf("ParseSigningSecret = %d bytes, %v; want %d bytes", len(key), err, s.bytes)
				}
				return
			}
			if !errors.Is(err, ErrBadSecret) || !strings.Contains(err.Error(), s.want) {
				t.Fatalf("err = %v, want ErrBadSecret containing %q", err, s.want)
			}
			if !strings.Contains(err.Error(), "expected whsec_ followed by the standard base64") {
				t.Errorf("err = %q does not say the expected form", err)
			}
			if b64 := strings.TrimPrefix(s.secret, "whsec_"); len(b64) > 8 && strings.Contains(err.Error(), b64) {
				t.Errorf("err = %q repeats the secret", err)
			}
		})
	}
}

// bytes32 is 32 bytes of b: base64 of 0xfb bytes uses '+' and '/' in the
// standard alphabet, '-' and '_' in the URL one.
func bytes32(b byte) []byte { return []byte(strings.Repeat(string([]byte{b}), 32)) }

func TestNewSignerErrors(t *testing.T) {
	steps := []struct {
		name    string
		secrets []string
		want    string
	}{
		{"none", nil, "no secrets"},
		{"empty second", []string{whsec(32), ""}, "secrets[1]: empty"},
		{"bad base64", []string{"whsec_!!!notbase64"}, "secrets[0]: the part after whsec_ is not standard base64"},
		{"raw third", []string{whsec(32), whsec(24), "raw-key-raw-key-raw-key-raw-key"}, "secrets[2]: does not start with whsec_"},
	}
	for _, s := range steps {
		t.Run(s.name, func(t *testing.T) {
			_, err := NewSigner(s.secrets, nil)
			if !errors.Is(err, ErrBadSecret) {
				t.Fatalf("err = %v, want ErrBadSecret", err)
			}
			if !strings.Contains(err.Error(), s.want) {
				t.Errorf("err = %q, want it to contain %q", err, s.want)
			}
		})
	}
}

func TestNilSigner(t *testing.T) {
	var s *Signer
	if h := s.Sign("id", nil); h != nil {
		t.Errorf("nil signer signed: %v", h)
	}
}
