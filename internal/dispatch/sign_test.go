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
	s, err := NewSigner(secrets, func() time.Time { return now })
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

func TestSignerRawSecret(t *testing.T) {
	s, err := NewSigner([]string{"plain-text-key"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	h := s.Sign("id", []byte("b"))
	if !verifyStandardWebhook(t, []byte("plain-text-key"), "id", h.Get(HeaderWebhookTimestamp), []byte("b"), h.Get(HeaderWebhookSignature)) {
		t.Error("raw secret: signature does not verify")
	}
	// nil now means the real clock.
	ts, err := strconv.ParseInt(h.Get(HeaderWebhookTimestamp), 10, 64)
	if d := time.Since(time.Unix(ts, 0)); err != nil || d < -time.Second || d > time.Minute {
		t.Errorf("timestamp %q is not now (off by %v, err %v)", h.Get(HeaderWebhookTimestamp), d, err)
	}
}

func TestNewSignerErrors(t *testing.T) {
	steps := []struct {
		name    string
		secrets []string
		want    string
	}{
		{"none", nil, "no secrets"},
		{"empty second", []string{"ok-key", ""}, "secrets[1]: empty"},
		{"bad base64", []string{"whsec_!!!notbase64"}, "secrets[0]: whsec_ value is not valid base64"},
		{"empty whsec", []string{"k", "k2", "whsec_"}, "secrets[2]: whsec_ value is empty"},
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
	// Unpadded base64 is accepted.
	if _, err := NewSigner([]string{"whsec_YWJj"}, nil); err != nil {
		t.Errorf("padded: %v", err)
	}
	if _, err := NewSigner([]string{"whsec_YWJjZA"}, nil); err != nil {
		t.Errorf("unpadded: %v", err)
	}
}

func TestNilSigner(t *testing.T) {
	var s *Signer
	if h := s.Sign("id", nil); h != nil {
		t.Errorf("nil signer signed: %v", h)
	}
}
