package dest_test

import (
	"errors"
	"testing"

	"github.com/throttler/throttler/internal/dest"
)

// TestCheckCallback: a callback URL is compared with the prefixes as a
// job's URL is with job_urls, and a refusal names Throttle-Callback.
func TestCheckCallback(t *testing.T) {
	t.Parallel()
	p, err := dest.NewPrefixes([]string{"https://hooks.example.com/cb/", "http://10.0.0.7:8080/in"})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		url string
		err error // nil: allowed
	}{
		{"https://hooks.example.com/cb", nil},
		{"https://hooks.example.com/cb/order-1?x=1", nil},
		{"https://HOOKS.example.com:443/cb/a", nil},
		{"http://10.0.0.7:8080/in/a", nil},
		{"https://hooks.example.com/cbx", dest.ErrCallbackNotAllowed},
		{"https://hooks.example.com/other", dest.ErrCallbackNotAllowed},
		{"http://hooks.example.com/cb/a", dest.ErrCallbackNotAllowed},
		{"https://hooks.example.com:8443/cb/a", dest.ErrCallbackNotAllowed},
		{"https://hooks.example.com.evil.net/cb/a", dest.ErrCallbackNotAllowed},
		{"http://10.0.0.7/in/a", dest.ErrCallbackNotAllowed},
		{"https://hooks.example.com/cb/../admin", dest.ErrPathEscapes},
		{"https://hooks.example.com/cb/%2e%2e/admin", dest.ErrPathEscapes},
		{"https://hooks.example.com/cb/%2fadmin", dest.ErrPathEscapes},
		{"https://u:p@hooks.example.com/cb/a", dest.ErrBadPath},
		{"https://hooks.example.com/cb/a#f", dest.ErrBadPath},
		{"https://hooks.example.com/cb/a\\b", dest.ErrBadPath},
		{"ftp://hooks.example.com/cb/a", dest.ErrBadPath},
		{"/cb/a", dest.ErrBadPath},
	} {
		_, err := p.CheckCallback(tc.url)
		var de *dest.Error
		switch {
		case tc.err == nil && err != nil:
			t.Errorf("%s: %v; want it allowed", tc.url, err)
		case tc.err != nil && (!errors.Is(err, tc.err) || !errors.As(err, &de) || de.Field != dest.HeaderCallback):
			t.Errorf("%s: %v; want %v naming %s", tc.url, err, tc.err, dest.HeaderCallback)
		}
	}
	var none *dest.Prefixes
	if _, err := none.CheckCallback("https://hooks.example.com/cb"); !errors.Is(err, dest.ErrCallbackNotAllowed) {
		t.Errorf("no prefixes: %v; want ErrCallbackNotAllowed", err)
	}
	if _, err := dest.NewPrefixes([]string{"https://a.example.com/", "https://b.example.com/?q"}); err == nil {
		t.Error("a prefix with a query was taken")
	}
}

// TestUncovered: every callback prefix must lie under one of a callback
// lane's job_urls.
func TestUncovered(t *testing.T) {
	t.Parallel()
	r := rules(t) // job_urls https://api.example.com/v2/, http://hooks.example.net:8080/in
	for _, tc := range []struct {
		prefixes []string
		want     int
	}{
		{[]string{"https://api.example.com/v2"}, -1},
		{[]string{"https://api.example.com/v2/cb", "http://hooks.example.net:8080/in/x"}, -1},
		{[]string{"https://api.example.com/v2/cb", "https://api.example.com/v3"}, 1},
		{[]string{"https://api.example.com/v20"}, 0},
		{[]string{"https://api.example.com/"}, 0},
		{[]string{"http://hooks.example.net/in"}, 0},
	} {
		p, err := dest.NewPrefixes(tc.prefixes)
		if err != nil {
			t.Fatal(err)
		}
		if got := r.Uncovered(p); got != tc.want {
			t.Errorf("%v: Uncovered %d, want %d", tc.prefixes, got, tc.want)
		}
	}
}
