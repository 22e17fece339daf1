package bucket_test

import (
	"testing"

	"github.com/throttler/throttler/internal/bucket"
	"github.com/throttler/throttler/internal/bucket/buckettest"
	"github.com/throttler/throttler/internal/clock"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestMemoryConformance(t *testing.T) {
	buckettest.Run(t, func(t *testing.T, c *clock.Manual) bucket.Store {
		return &bucket.Memory{Clock: c}
	}, buckettest.Options{})
}
