package lane

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/throttler/throttler/internal/bucket"
)

// Control messages carry a lane's pause, slow-down and limit decisions to
// every instance, on the core NATS subject ControlSubject(lane). They are
// JSON with a version; one is at most maxControlSize bytes, and its values
// are checked against bounds before anything changes, so a message from a
// broken or hostile publisher cannot stop a lane for good or set an absurd
// rate. A message of an unknown version is logged and ignored (a newer
// instance during a rolling upgrade).
type control struct {
	V    int    `json:"v"`
	Kind string `json:"kind"`
	// PauseMillis: kind "pause", how long every drain holds the lane.
	PauseMillis int64 `json:"pause_ms,omitempty"`
	// Factor: kind "factor", adaptive mode's share of the configured rate.
	Factor float64 `json:"factor,omitempty"`
	// Rate and Burst: kind "limit", the lane's new limit.
	Rate  float64 `json:"rate,omitempty"`
	Burst int     `json:"burst,omitempty"`
	// From names the sender (an instance id), for the log.
	From string `json:"from,omitempty"`
}

// Control kinds and the current version.
const (
	controlVersion = 1
	kindPause      = "pause"
	kindFactor     = "factor"
	kindLimit      = "limit"
	maxControlSize = 1024
)

// ControlSubject carries a lane's control messages (core NATS, outside the
// lane streams' subjects).
func ControlSubject(lane string) string { return "throttler.control." + lane }

// controlBounds are what a control message may ask of one lane.
type controlBounds struct {
	// MaxPause bounds a pause: the longest wait a downstream may ask for
	// (dispatch.MaxPause).
	MaxPause time.Duration
	// MinFactor is adaptive.min; a factor must lie in [MinFactor, 1].
	// Zero: the lane is not adaptive and takes no factor.
	MinFactor float64
	// MinRate, MaxRate and MaxBurst bound a limit.
	MinRate, MaxRate float64
	MaxBurst         int
}

// errUnknownVersion marks a control message of another version.
var errUnknownVersion = errors.New("unknown control message version")

// parseControl decodes and checks one control message.
func parseControl(data []byte, b controlBounds) (control, error) {
	var c control
	if len(data) > maxControlSize {
		return c, fmt.Errorf("control message of %d bytes is over %d", len(data), maxControlSize)
	}
	if err := json.Unmarshal(data, &c); err != nil {
		return c, fmt.Errorf("control message is not JSON: %w", err)
	}
	if c.V != controlVersion {
		return c, fmt.Errorf("%w %d (this instance speaks %d)", errUnknownVersion, c.V, controlVersion)
	}
	switch c.Kind {
	case kindPause:
		if c.PauseMillis <= 0 || c.PauseMillis > b.MaxPause.Milliseconds() {
			return c, fmt.Errorf("pause of %d ms is not in (0, %v]", c.PauseMillis, b.MaxPause)
		}
	case kindFactor:
		if b.MinFactor == 0 {
			return c, errors.New("factor for a lane that is not adaptive")
		}
		if math.IsNaN(c.Factor) || c.Factor < b.MinFactor || c.Factor > 1 {
			return c, fmt.Errorf("factor %v is not in [%v, 1]", c.Factor, b.MinFactor)
		}
	case kindLimit:
		lim := bucket.Limit{Rate: c.Rate, Burst: c.Burst}
		if err := lim.Validate(); err != nil {
			return c, err
		}
		if c.Rate < b.MinRate || c.Rate > b.MaxRate {
			return c, fmt.Errorf("rate %v is not in the lane's range [%v, %v]", c.Rate, b.MinRate, b.MaxRate)
		}
		if c.Burst > b.MaxBurst {
			return c, fmt.Errorf("burst %d is over the lane's maximum %d", c.Burst, b.MaxBurst)
		}
	default:
		return c, fmt.Errorf("unknown control kind %q", c.Kind)
	}
	return c, nil
}

// encode writes c with the current version.
func (c control) encode() []byte {
	c.V = controlVersion
	b, _ := json.Marshal(c) // numbers and strings: cannot fail
	return b
}
