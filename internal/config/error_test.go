package config_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/throttler/throttler/internal/bucket"
	"github.com/throttler/throttler/internal/config"
)

// TestErrorUnwraps: a *config.Error made from another error keeps it in the
// chain (errors.Is and errors.As reach it) and still names the file and the
// field; one made from nothing unwraps to nil.
func TestErrorUnwraps(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "keys.yaml")
	for _, tc := range []struct {
		name, yaml string
		is         error
		field      string
	}{
		{"BadRate", strings.Replace(good, "rate: 20", "rate: 5/w", 1), bucket.ErrInvalidRate, "lanes[0].rate"},
		{"MissingKeysFile", good + "auth:\n  keys_file: " + missing + "\n", os.ErrNotExist, "auth.keys_file"},
	} {
		_, err := config.Parse("t.yaml", []byte(tc.yaml), func(string) string { return "" })
		var ce *config.Error
		if !errors.As(err, &ce) || ce.File != "t.yaml" || ce.Field != tc.field || !errors.Is(err, tc.is) {
			t.Errorf("%s: %v (%+v), want a *config.Error naming t.yaml and %s that matches %v", tc.name, err, ce, tc.field, tc.is)
		}
	}
	_, err := config.Parse("t.yaml", []byte(strings.Replace(good, "rate: 20", "rate: 0", 1)), func(string) string { return "" })
	var ce *config.Error
	if !errors.As(err, &ce) || ce.Unwrap() != nil {
		t.Errorf("zero rate: %v, want a *config.Error that wraps nothing", err)
	}
}
