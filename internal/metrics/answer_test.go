package metrics_test

import (
	"testing"

	"github.com/throttler/throttler/internal/metrics"
)

func TestAnswerClass(t *testing.T) {
	for _, tc := range []struct {
		status int
		failed bool
		want   string
	}{
		{200, false, "2xx"}, {204, false, "2xx"}, {302, false, "3xx"}, {429, true, "4xx"}, {404, false, "4xx"},
		{500, true, "5xx"}, {503, false, "5xx"}, {0, true, "error"}, {0, false, "none"}, {101, false, "error"}, {700, true, "error"},
	} {
		if got := metrics.AnswerClasses[metrics.AnswerClass(tc.status, tc.failed)]; got != tc.want {
			t.Errorf("AnswerClass(%d, %v) = %s, want %s", tc.status, tc.failed, got, tc.want)
		}
	}
}
