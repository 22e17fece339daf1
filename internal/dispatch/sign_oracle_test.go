package dispatch_test

import (
	"crypto/rand"
	"encoding/base64"
	"net/http"
	"testing"
	"time"

	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"
	"github.com/throttler/throttler/internal/clock"
	"github.com/throttler/throttler/internal/dispatch"
)

// TestSignerStandardWebhooksOracle checks our signatures with the official
// Standard Webhooks Go library: every secret of a rotation verifies every
// message (several payloads and timestamps), the library's own signature
// for a single secret is byte for byte ours, and a wrong secret, id, body or
// timestamp fails.
func TestSignerStandardWebhooksOracle(t *testing.T) {
	secret := func(n int) string {
		key := make([]byte, n)
		if _, err := rand.Read(key); err != nil {
			t.Fatal(err)
		}
		return "whsec_" + base64.StdEncoding.EncodeToString(key)
	}
	rotation := []string{"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", secret(24), secret(32), secret(64)}
	binary := make([]byte, 4096)
	if _, err := rand.Read(binary); err != nil {
		t.Fatal(err)
	}
	payloads := [][]byte{nil, []byte(`{"test": 2432232314}`), []byte("héllo\x00wörld\n"), binary}
	ids := []string{"msg_p5jXN8AQM9LWM0D4loKWxJek", "job-1", "01J9Z6Q8C1Y4H2K7M3N5P6R8S0"}
	now := time.Now()
	stamps := []time.Time{time.Unix(1614265330, 0), time.Unix(0, 0), time.Unix(4102444800, 999_999_999), now}

	for n := 1; n <= len(rotation); n++ {
		secrets := rotation[:n]
		for _, at := range stamps {
			s, err := dispatch.NewSigner(secrets, clock.NewManual(at))
			if err != nil {
				t.Fatal(err)
			}
			for _, id := range ids {
				for _, body := range payloads {
					h := s.Sign(id, body)
					for i, sec := range secrets {
						wh, err := standardwebhooks.NewWebhook(sec)
						if err != nil {
							t.Fatalf("library refused secret %d: %v", i, err)
						}
						verify := wh.VerifyIgnoringTimestamp
						if at == now {
							verify = wh.Verify // within the library's 5-minute tolerance
						}
						if err := verify(body, h); err != nil {
							t.Errorf("secrets %d of %d, id %q, at %d, %d-byte body: library says %v", i, n, id, at.Unix(), len(body), err)
						}
					}
					if n == 1 {
						wh, _ := standardwebhooks.NewWebhook(secrets[0])
						want, err := wh.Sign(id, at, body)
						if got := h.Get(dispatch.HeaderWebhookSignature); err != nil || got != want {
							t.Errorf("id %q at %d: signature %q, library signs %q (%v)", id, at.Unix(), got, want, err)
						}
					}
				}
			}
		}
	}

	// The oracle really checks.
	s, err := dispatch.NewSigner(rotation[:2], nil)
	if err != nil {
		t.Fatal(err)
	}
	h := s.Sign("job-1", []byte("body"))
	other, _ := standardwebhooks.NewWebhook(secret(32))
	if other.Verify([]byte("body"), h) == nil {
		t.Error("an unrelated secret verified")
	}
	wh, _ := standardwebhooks.NewWebhook(rotation[1])
	if wh.Verify([]byte("bodY"), h) == nil {
		t.Error("a changed body verified")
	}
	for name, change := range map[string]func(http.Header){
		"id":        func(h http.Header) { h.Set(dispatch.HeaderWebhookID, "job-2") },
		"timestamp": func(h http.Header) { h.Set(dispatch.HeaderWebhookTimestamp, "1") },
	} {
		c := h.Clone()
		change(c)
		if wh.VerifyIgnoringTimestamp([]byte("body"), c) == nil {
			t.Errorf("a changed %s verified", name)
		}
	}
}
