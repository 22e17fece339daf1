package dispatch_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"time"

	"github.com/throttler/throttler/internal/dispatch"
)

// A downstream at its quota answers 429 with Retry-After: the job is
// retried and the whole lane should pause for that long.
func ExampleHTTP_Deliver() {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Retry-After", "30")
		w.WriteHeader(http.StatusTooManyRequests)
	}))
	defer srv.Close()

	// The test server listens on 127.0.0.1, which the guard refuses
	// unless allowed.
	guard := dispatch.NewGuard([]netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")})
	target, err := dispatch.NewHTTP(dispatch.HTTPConfig{URL: srv.URL + "/hook", Timeout: 5 * time.Second}, guard)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer target.Close()

	res := target.Deliver(context.Background(), dispatch.Job{ID: "job-1", Payload: []byte("{}")})
	fmt.Println(res.Verdict, res.Status, res.RetryAfter, res.PauseLane)
	// Output: retry 429 30s 30s
}

// The Standard Webhooks reference test vector.
func ExampleSigner_SignAt() {
	s, err := dispatch.NewSigner([]string{"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"}, nil)
	if err != nil {
		fmt.Println(err)
		return
	}
	h := s.SignAt("msg_p5jXN8AQM9LWM0D4loKWxJek", time.Unix(1614265330, 0), []byte(`{"test": 2432232314}`))
	fmt.Println(h.Get("webhook-signature"))
	// Output: v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=
}

// CheckURL fails early, at config time, on a target the guard would refuse
// at every delivery.
func ExampleGuard_CheckURL() {
	g := dispatch.NewGuard(nil)
	fmt.Println(g.CheckURL(context.Background(), "http://169.254.169.254/latest/meta-data"))
	// Output: dispatch: check url http://169.254.169.254: forbidden address 169.254.169.254 (link-local)
}
