package bench

import (
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"time"
)

// progress shows where a run is. On a terminal it redraws one line with a
// bar; elsewhere (CI logs, files) it prints a line per scenario and phase.
// Safe for concurrent use; redraws are throttled.
type progress struct {
	w   io.Writer
	tty bool

	mu      sync.Mutex
	prefix  string
	phase   string
	started time.Time
	drawn   time.Time
	width   int
}

const barWidth = 24

func newProgress(w io.Writer) *progress {
	if w == nil {
		w = io.Discard
	}
	p := &progress{w: w}
	if f, ok := w.(*os.File); ok {
		if st, err := f.Stat(); err == nil && st.Mode()&os.ModeCharDevice != 0 {
			p.tty = true
		}
	}
	return p
}

// scenario starts scenario i of n.
func (p *progress) scenario(i, n int, id string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.prefix, p.phase, p.started = fmt.Sprintf("[%d/%d] %s", i, n, id), "", time.Now()
	if !p.tty {
		fmt.Fprintf(p.w, "bench: %s\n", p.prefix)
	}
}

// set reports done of total in the current phase of the scenario.
func (p *progress) set(phase string, done, total int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.tty {
		if phase != p.phase {
			fmt.Fprintf(p.w, "bench: %s: %s\n", p.prefix, phase)
		}
		p.phase = phase
		return
	}
	p.phase = phase
	now := time.Now()
	if now.Sub(p.drawn) < 100*time.Millisecond && done < total {
		return
	}
	p.drawn = now
	frac := 0.0
	if total > 0 {
		frac = min(1, float64(done)/float64(total))
	}
	fill := int(frac * barWidth)
	line := fmt.Sprintf("%s · %s [%s%s] %3.0f%% %d/%d %.1fs", p.prefix, phase,
		strings.Repeat("#", fill), strings.Repeat("-", barWidth-fill), frac*100, done, total, now.Sub(p.started).Seconds())
	p.draw(line)
}

// draw replaces the terminal line; the caller holds mu.
func (p *progress) draw(line string) {
	pad := max(0, p.width-len(line))
	fmt.Fprintf(p.w, "\r%s%s", line, strings.Repeat(" ", pad))
	p.width = len(line)
}

// done ends the current scenario.
func (p *progress) done() {
	p.mu.Lock()
	defer p.mu.Unlock()
	took := time.Since(p.started).Round(100 * time.Millisecond)
	if p.tty {
		p.draw(fmt.Sprintf("%s done in %v", p.prefix, took))
		fmt.Fprintln(p.w)
		p.width = 0
		return
	}
	fmt.Fprintf(p.w, "bench: %s done in %v\n", p.prefix, took)
}
