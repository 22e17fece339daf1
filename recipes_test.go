package throttler_test

// The recipes of docs/RECIPES.md and the README's quickstart, run as
// written. Each fenced block that a test runs is tagged by a comment on the
// line before it,
//
//	<!-- recipe: NAME STEP -->
//
// and the test of recipe NAME runs its blocks in the order a reader does: a
// STEP with a dot is a file to save (nats.yaml, receiver.go), the others
// are commands for bash. The one change made to them is the ports: 8080,
// 4222 and 9000 become free ones, so that the tests run next to anything
// else. Every block of docs/RECIPES.md but ```text samples is tagged, and
// each test checks that it ran all of its recipe's blocks: the page cannot
// drift from what works.

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/throttler/throttler/api"
	"github.com/throttler/throttler/internal/testenv"
)

// recipeTag is the comment that tags a block.
var recipeTag = regexp.MustCompile(`^<!-- recipe: ([a-z0-9-]+) ([A-Za-z0-9._-]+) -->$`)

// docBlock is a tagged fenced block of a markdown file.
type docBlock struct {
	name, step, lang, text string
	line                   int
}

// docBlocks reads the tagged fenced blocks of a markdown file. With
// allTagged, an untagged block is an error unless it is a ```text sample.
func docBlocks(t *testing.T, path string, allTagged bool) []docBlock {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(string(raw), "\n")
	var blocks []docBlock
	seen := map[string]int{}
	for i := 0; i < len(lines); i++ {
		var tag []string
		if m := recipeTag.FindStringSubmatch(lines[i]); m != nil {
			tag = m[1:]
			if i+1 == len(lines) || !strings.HasPrefix(lines[i+1], "```") {
				t.Fatalf("%s:%d: the tag is not on the line before a fenced block", path, i+1)
			}
			i++
		}
		if !strings.HasPrefix(lines[i], "```") {
			continue
		}
		lang, start := strings.TrimPrefix(lines[i], "```"), i+1
		var body []string
		for i++; i < len(lines) && lines[i] != "```"; i++ {
			body = append(body, lines[i])
		}
		if i == len(lines) {
			t.Fatalf("%s:%d: the block is not closed", path, start)
		}
		switch {
		case tag != nil:
			key := tag[0] + " " + tag[1]
			if prev, ok := seen[key]; ok {
				t.Fatalf("%s:%d: %q is also the tag of line %d", path, start, key, prev)
			}
			seen[key] = start
			blocks = append(blocks, docBlock{name: tag[0], step: tag[1], lang: lang, text: strings.Join(body, "\n") + "\n", line: start})
		case allTagged && lang != "text":
			t.Errorf("%s:%d: a ```%s block without a <!-- recipe: NAME STEP --> tag on the line before: every block of this page is run by a test", path, start, lang)
		}
	}
	return blocks
}

// TestRecipesAreAllTested: every block of docs/RECIPES.md belongs to a
// recipe that a test below runs.
func TestRecipesAreAllTested(t *testing.T) {
	t.Parallel()
	tested := []string{"nats", "crm", "webhooks", "answers", "api", "receivers"}
	for _, b := range docBlocks(t, "docs/RECIPES.md", true) {
		if !slices.Contains(tested, b.name) {
			t.Errorf("docs/RECIPES.md:%d: recipe %q has no test", b.line, b.name)
		}
	}
}

// recipe runs the blocks of one recipe in a directory of its own, which
// holds bin/throttler like a checkout after make build.
type recipe struct {
	t      *testing.T
	doc    string
	blocks map[string]docBlock
	used   map[string]bool
	dir    string
	env    []string
	ports  map[string]int // the port of the docs (8080, 4222, 9000) → the one used
	subst  *strings.Replacer
	// partial: the test runs some of the recipe's blocks; another runs all.
	partial bool
}

func newRecipe(t *testing.T, doc, name string) *recipe {
	t.Helper()
	r := &recipe{t: t, doc: doc, blocks: map[string]docBlock{}, used: map[string]bool{}, dir: t.TempDir(), ports: map[string]int{}}
	for _, b := range docBlocks(t, doc, doc == "docs/RECIPES.md") {
		if b.name == name {
			r.blocks[b.step] = b
		}
	}
	if len(r.blocks) == 0 {
		t.Fatalf("%s has no blocks of recipe %q", doc, name)
	}
	var pairs []string
	for _, p := range []string{"8080", "4222", "9000"} {
		r.ports[p] = freePort(t)
		for _, host := range []string{"127.0.0.1:", "localhost:"} {
			pairs = append(pairs, host+p, host+strconv.Itoa(r.ports[p]))
		}
	}
	r.subst = strings.NewReplacer(pairs...)

	if err := os.MkdirAll(filepath.Join(r.dir, "bin"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(throttlerBinary(t), filepath.Join(r.dir, "bin", "throttler")); err != nil {
		t.Fatal(err)
	}
	// The nats command is this test binary (natsCLI).
	tools := t.TempDir()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(self, filepath.Join(tools, "nats")); err != nil {
		t.Fatal(err)
	}
	for _, kv := range os.Environ() {
		k, v, _ := strings.Cut(kv, "=")
		switch {
		case strings.HasPrefix(k, "THROTTLER_"), strings.HasPrefix(k, "NATS_"):
		case k == "PATH":
			r.env = append(r.env, "PATH="+tools+string(os.PathListSeparator)+v)
		default:
			r.env = append(r.env, kv)
		}
	}
	t.Cleanup(func() {
		if t.Failed() || t.Skipped() || r.partial {
			return
		}
		for step, b := range r.blocks {
			if !r.used[step] {
				t.Errorf("%s:%d: block %q of recipe %q is not run by %s", doc, b.line, step, name, t.Name())
			}
		}
	})
	return r
}

// port is the port used for one the docs write (8080, 4222, 9000).
func (r *recipe) port(written string) int { return r.ports[written] }

// url is an http://127.0.0.1 URL on the port used for written.
func (r *recipe) url(written, path string) string {
	return fmt.Sprintf("http://127.0.0.1:%d%s", r.port(written), path)
}

// block returns a block's text with the ports replaced.
func (r *recipe) block(step string) string {
	r.t.Helper()
	b, ok := r.blocks[step]
	if !ok {
		r.t.Fatalf("%s has no block %q", r.doc, step)
	}
	r.used[step] = true
	text := r.subst.Replace(b.text)
	if m := regexp.MustCompile(`\b(8080|4222|9000)\b`).FindString(text); m != "" {
		r.t.Fatalf("%s:%d: port %s is written in a form the test does not replace (127.0.0.1:%s or localhost:%s)", r.doc, b.line, m, m, m)
	}
	return text
}

// save writes a file block to the recipe's directory under its name.
func (r *recipe) save(step string) {
	r.t.Helper()
	if err := os.WriteFile(filepath.Join(r.dir, step), []byte(r.block(step)), 0o644); err != nil {
		r.t.Fatal(err)
	}
}

// export runs a block and keeps the environment it leaves for the later ones.
func (r *recipe) export(step string) {
	r.t.Helper()
	out := r.bash(r.block(step)+"env -0\n", step, 30*time.Second)
	r.env = strings.Split(strings.TrimSuffix(out, "\x00"), "\x00")
}

// run runs a command block and returns its output, stdout and stderr.
func (r *recipe) run(step string) string {
	r.t.Helper()
	return r.bash(r.block(step), step, 60*time.Second)
}

func (r *recipe) bash(script, step string, timeout time.Duration) string {
	r.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", "-e", "-o", "pipefail", "-c", script)
	cmd.Dir, cmd.Env = r.dir, r.env
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		r.t.Fatalf("%s, block %q:\n%s\nfailed: %v\n%s", r.doc, step, script, err, out.String())
	}
	return out.String()
}

// start runs a command block in the background, as a reader runs it in a
// shell of its own, and waits until its output holds ready.
func (r *recipe) start(step, ready string) *bgProc {
	r.t.Helper()
	return r.startCommand(step, r.block(step), ready)
}

func (r *recipe) startCommand(name, script, ready string) *bgProc {
	r.t.Helper()
	p := &bgProc{t: r.t, name: name, cmd: exec.Command("bash", "-c", script), out: &lineLog{}, done: make(chan struct{})}
	p.cmd.Dir, p.cmd.Env = r.dir, r.env
	p.cmd.Stdout, p.cmd.Stderr = p.out, p.out
	// A group of its own, like a shell's job: stop signals it all (go run
	// and the program it runs).
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := p.cmd.Start(); err != nil {
		r.t.Fatal(err)
	}
	go func() { p.cmd.Wait(); close(p.done) }()
	r.t.Cleanup(func() {
		p.stop()
		if r.t.Failed() {
			r.t.Logf("output of %q:\n%s", name, tail(p.out.String(), 40))
		}
	})
	deadline := time.Now().Add(3 * time.Minute) // go run may compile first
	for !strings.Contains(p.out.String(), ready) {
		select {
		case <-p.done:
			r.t.Fatalf("%q ended before it printed %q:\n%s", name, ready, p.out.String())
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			r.t.Fatalf("%q did not print %q:\n%s", name, ready, p.out.String())
		}
	}
	return p
}

// getenv is a variable of the recipe's environment.
func (r *recipe) getenv(name string) string {
	for _, kv := range r.env {
		if k, v, _ := strings.Cut(kv, "="); k == name {
			return v
		}
	}
	return ""
}

// bgProc is a command running in the background.
type bgProc struct {
	t    *testing.T
	name string
	cmd  *exec.Cmd
	out  *lineLog
	done chan struct{}
}

// stop sends SIGINT to the command's group, as Ctrl-C does, and waits for
// it to end (SIGKILL after 20 s).
func (p *bgProc) stop() {
	select {
	case <-p.done:
		return
	default:
	}
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGINT)
	select {
	case <-p.done:
	case <-time.After(20 * time.Second):
		p.t.Errorf("%q did not stop within 20 s of SIGINT", p.name)
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
		<-p.done
	}
}

// lineLog keeps output line by line, with the time each line arrived.
type lineLog struct {
	mu      sync.Mutex
	partial []byte
	lines   []logLine
	all     bytes.Buffer
}

type logLine struct {
	at   time.Time
	text string
}

func (l *lineLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := time.Now()
	l.all.Write(p)
	l.partial = append(l.partial, p...)
	for {
		i := bytes.IndexByte(l.partial, '\n')
		if i < 0 {
			return len(p), nil
		}
		l.lines = append(l.lines, logLine{at: now, text: string(l.partial[:i])})
		l.partial = l.partial[i+1:]
	}
}

func (l *lineLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.all.String()
}

// matching returns the complete lines that hold s.
func (l *lineLog) matching(s string) []logLine {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []logLine
	for _, line := range l.lines {
		if strings.Contains(line.text, s) {
			out = append(out, line)
		}
	}
	return out
}

func freePort(t *testing.T) int {
	t.Helper()
	return testenv.FreePort(t)
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// laneState is the part of a GET /v1/lanes entry the tests read.
type laneState struct {
	Name          string  `json:"name"`
	Rate          float64 `json:"rate"`
	EffectiveRate float64 `json:"effective_rate"`
	Burst         int     `json:"burst"`
	Quota         *struct {
		Limit int64  `json:"limit"`
		Per   string `json:"per"`
		Burst int    `json:"burst"`
	} `json:"quota"`
	Target    string `json:"target"`
	Backlog   int    `json:"backlog"`
	Delivered int    `json:"delivered"`
	Dead      int    `json:"dead"`
}

// oneLane parses the output of `curl -s …/v1/lanes` holding one lane.
func oneLane(t *testing.T, out string) laneState {
	t.Helper()
	var body struct {
		Lanes []laneState `json:"lanes"`
	}
	if err := json.Unmarshal([]byte(out), &body); err != nil || len(body.Lanes) != 1 {
		t.Fatalf("GET /v1/lanes printed %q: %v", out, err)
	}
	return body.Lanes[0]
}

// jobAnswer is a 202 answer to a submission.
type jobAnswer struct {
	ID        string `json:"id"`
	State     string `json:"state"`
	ETAms     int64  `json:"eta_ms"`
	Duplicate bool   `json:"duplicate"`
}

// answers parses output that must be one submission answer per line.
func answers(t *testing.T, out string) []jobAnswer {
	t.Helper()
	var as []jobAnswer
	for _, line := range strings.Split(strings.TrimSuffix(out, "\n"), "\n") {
		var a jobAnswer
		if err := json.Unmarshal([]byte(line), &a); err != nil || a.ID == "" {
			t.Fatalf("not one answer per line: %q in\n%s", line, out)
		}
		as = append(as, a)
	}
	return as
}

// TestRecipeNATS runs recipe 1: jobs published on NATS with the nats tool,
// paced to a worker pool that the nats tool plays.
func TestRecipeNATS(t *testing.T) {
	t.Parallel()
	r := newRecipe(t, "docs/RECIPES.md", "nats")
	r.save("nats.yaml")
	r.export("env")
	r.start("serve", `"throttler ready"`)
	worker := r.start("worker", "Listening on")

	out := r.run("publish")
	if n := strings.Count(out, "Stored in Stream: THROTTLE_orders Sequence:"); n != 10 {
		t.Fatalf("%d of 10 publishes stored:\n%s", n, out)
	}
	testenv.Eventually(t, 30*time.Second, "10 orders at the worker", func() bool {
		return len(worker.out.matching("Received on subject")) >= 10
	})
	var ids []string
	for _, l := range worker.out.matching("Idempotency-Key: ") {
		ids = append(ids, l.text[strings.Index(l.text, "order-"):])
	}
	slices.Sort(ids)
	want := []string{"order-1", "order-10", "order-2", "order-3", "order-4", "order-5", "order-6", "order-7", "order-8", "order-9"}
	if !slices.Equal(ids, want) {
		t.Fatalf("the worker received %q, want each order once", ids)
	}
	// At 2/s the ten start 500 ms apart (published jobs take no burst token).
	recv := worker.out.matching("Received on subject")
	if span := recv[9].at.Sub(recv[0].at); span < 9*500*time.Millisecond*8/10 {
		t.Errorf("10 jobs at 2/s reached the worker within %v", span)
	}
	lanesURL := r.url("8080", "/v1/lanes")
	testenv.Eventually(t, 10*time.Second, "10 jobs acked", func() bool { return getLane(t, lanesURL).Delivered == 10 })

	out = r.run("duplicate")
	if !strings.Contains(out, "Stored in Stream: THROTTLE_orders Sequence: 1 Duplicate: true") {
		t.Fatalf("the second order-1 was not answered as a duplicate of the first:\n%s", out)
	}
	// Nothing was stored: it is neither waiting nor delivered.
	if l := oneLane(t, r.run("lanes")); l.Delivered != 10 || l.Backlog != 0 {
		t.Fatalf("after the duplicate: delivered %d, backlog %d; want 10 and 0", l.Delivered, l.Backlog)
	}
	if n := len(worker.out.matching("Received on subject")); n != 10 {
		t.Fatalf("the worker received %d jobs, want 10", n)
	}
}

// TestRecipeQuota runs recipe 2: a provider's quota, with `throttler sink`
// standing in for the provider, first answering 200, then 429.
func TestRecipeQuota(t *testing.T) {
	t.Parallel()
	r := newRecipe(t, "docs/RECIPES.md", "crm")
	r.save("crm.yaml")
	r.export("env")
	sink := r.start("sink", `"sink listening"`)
	r.start("serve", `"throttler ready"`)

	// {limit: 1000, per: 1h} gives 998/h with burst 1.
	const period = time.Hour / 998
	l := oneLane(t, r.run("lanes"))
	if l.Name != "crm" || l.Burst != 1 || l.Rate != 998.0/3600 || l.Quota == nil || l.Quota.Limit != 1000 || l.Quota.Per != "1h0m0s" {
		t.Fatalf("lane %+v, quota %+v; want rate 998/h, burst 1, quota 1000 per 1h", l, l.Quota)
	}
	begin := time.Now()
	as := answers(t, r.run("submit"))
	took := time.Since(begin)
	if len(as) != 3 || as[0].State != "admitted" || as[0].ETAms != 0 {
		t.Fatalf("answers %+v; want the first admitted", as)
	}
	for k, a := range as[1:] {
		// The k+1-th queued call's slot is k+1 periods after the
		// admitted call's start, which came after the loop began; its
		// answer came before the loop ended. So its eta_ms is k+1
		// periods less at most the loop's time (measured: curl on a
		// loaded machine once took over a second a call), and never
		// more than k+1 periods; 100 ms each side for the millisecond
		// rounding and the admitted call's start after its store.
		want := time.Duration(k+1) * period
		lo, hi := want-took-100*time.Millisecond, want+100*time.Millisecond
		if got := time.Duration(a.ETAms) * time.Millisecond; a.State != "queued" || got < lo || got > hi {
			t.Errorf("answer %+v; want queued with eta_ms in [%d, %d] (%d less the loop's %v)", a, lo.Milliseconds(), hi.Milliseconds(), want.Milliseconds(), took.Round(time.Millisecond))
		}
	}

	// The provider answers 429: the lane halves its rate.
	sink.stop()
	r.start("sink429", `"sink listening"`)
	testenv.Eventually(t, 20*time.Second, "slow-down after a 429", func() bool {
		l := oneLane(t, r.run("lanes"))
		return l.EffectiveRate > 0 && l.EffectiveRate <= l.Rate/2+1e-9
	})
}

// TestRecipeAnswers: recipe 4's waited calls answer the API's answers
// (with the header the lane keeps), at the lane's rate; the record answers afterwards; a resubmission calls the
// API no more.
func TestRecipeAnswers(t *testing.T) {
	t.Parallel()
	r := newRecipe(t, "docs/RECIPES.md", "answers")
	r.save("geo.yaml")
	r.save("geo.go")
	r.start("api", "geo listening")
	r.start("serve", `"throttler ready"`)

	out := r.run("ask")
	for i := 1; i <= 3; i++ {
		for _, want := range []string{"Throttle-Job-Id: addr-" + strconv.Itoa(i), "X-Request-Id: geo-addr-" + strconv.Itoa(i),
			fmt.Sprintf(`{"address":"%d Champ de Mars, Paris"`, i)} {
			if !strings.Contains(out, want) {
				t.Fatalf("the waited answers lack %q:\n%s", want, out)
			}
		}
	}
	if n := strings.Count(out, "HTTP/1.1 200 OK"); n != 3 || strings.Count(out, "Throttle-Target-Status: 200") != 3 {
		t.Fatalf("%d answers 200; want 3 with Throttle-Target-Status 200:\n%s", n, out)
	}
	var rec api.JobRecord
	if err := json.Unmarshal([]byte(r.run("get")), &rec); err != nil {
		t.Fatal(err)
	}
	if rec.State != api.StateDelivered || rec.Response == nil || rec.Response.Headers["X-Request-Id"] != "geo-addr-1" ||
		!strings.Contains(rec.Response.Body, "1 Champ de Mars") || len(rec.Attempts) != 1 {
		t.Fatalf("record %+v", rec)
	}
	again := r.bash(r.subst.Replace(`curl -s -X POST -H "Idempotency-Key: addr-1" -d x localhost:8080/v1/lanes/geo/jobs`), "again", 10*time.Second)
	if !strings.Contains(again, `"state":"delivered"`) || !strings.Contains(again, `"duplicate":true`) {
		t.Fatalf("resubmission: %s", again)
	}
}

// TestRecipeQuotaSendsAuthorization: the lane of recipe 2 sends the
// provider's Authorization header from the environment, seen by a target
// that records what it receives (the sink of the recipe does not show
// headers).
func TestRecipeQuotaSendsAuthorization(t *testing.T) {
	t.Parallel()
	r := newRecipe(t, "docs/RECIPES.md", "crm")
	r.partial = true // the whole recipe runs in TestRecipeQuota
	r.save("crm.yaml")
	r.export("env")
	got := make(chan http.Header, 10)
	ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", r.port("9000")))
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if req.URL.Path == "/v1/contacts" {
			got <- req.Header
		}
	}), ReadHeaderTimeout: 5 * time.Second}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	r.start("serve", `"throttler ready"`)

	resp, err := pollClient.Post(r.url("8080", "/v1/lanes/crm/jobs"), "application/json", strings.NewReader(`{"email":"a@example.com"}`))
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	select {
	case h := <-got:
		if want := r.getenv("CRM_AUTHORIZATION"); want == "" || h.Get("Authorization") != want {
			t.Fatalf("Authorization %q, want %q", h.Get("Authorization"), want)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the job did not reach the target")
	}
}

// TestRecipeAPIEndpoints runs recipe 4: one lane in front of an API, three
// calls to three endpoints with their methods, and the refusals.
func TestRecipeAPIEndpoints(t *testing.T) {
	t.Parallel()
	r := newRecipe(t, "docs/RECIPES.md", "api")
	r.save("api.yaml")
	sink := r.start("sink", `"sink listening"`)
	r.start("serve", `"throttler ready"`)
	as := answers(t, r.run("submit"))
	if len(as) != 3 {
		t.Fatalf("answers %+v, want 3", as)
	}
	want := []string{`"method":"GET","path":"/api/repos/acme/widgets"`, `"method":"POST","path":"/api/repos/acme/widgets/issues"`,
		`"method":"DELETE","path":"/api/repos/acme/widgets/issues/7/lock"`}
	testenv.Eventually(t, 30*time.Second, "three calls at the sink", func() bool {
		for _, w := range want {
			if len(sink.out.matching(w)) != 1 {
				return false
			}
		}
		return true
	})
	out := r.run("refused")
	for _, field := range []string{`"field":"Throttle-Path"`, `"field":"Throttle-Forward-Authorization"`} {
		if !strings.Contains(out, field) || !strings.Contains(out, `"status":400`) {
			t.Errorf("refused: want a 400 naming %s:\n%s", field, out)
		}
	}
	if n := len(sink.out.matching("job received")); n != 3 {
		t.Errorf("%d jobs at the sink, want the 3 accepted only", n)
	}
}

// TestRecipeReceivers runs recipe 5: two receivers of one keyed lane, each
// with its own URL and rate, set with the CLI.
func TestRecipeReceivers(t *testing.T) {
	t.Parallel()
	r := newRecipe(t, "docs/RECIPES.md", "receivers")
	r.save("receivers.yaml")
	sink := r.start("sink", `"sink listening"`)
	r.start("serve", `"throttler ready"`)
	out := r.run("keys")
	for _, w := range []string{"acme target: url=http://127.0.0.1:" + strconv.Itoa(r.port("9000")) + "/hooks/acme headers=- signing_secret_set=false",
		"signing_secret_set=true"} {
		if !strings.Contains(out, w) {
			t.Errorf("keys: want %q in:\n%s", w, out)
		}
	}
	if strings.Contains(out, "whsec_") {
		t.Errorf("keys printed the signing secret:\n%s", out)
	}
	if as := answers(t, r.run("submit")); len(as) != 8 {
		t.Fatalf("answers %+v, want 8", as)
	}
	testenv.Eventually(t, 30*time.Second, "4 events at each receiver", func() bool {
		return len(sink.out.matching(`"path":"/hooks/acme"`)) == 4 && len(sink.out.matching(`"path":"/hooks/globex"`)) == 4
	})
	// At 2/s, globex's four are at least 1.5 s apart end to end (a
	// receiver paced at acme's 5/s would take 0.6 s).
	g := sink.out.matching(`"path":"/hooks/globex"`)
	if span := g[3].at.Sub(g[0].at); span < 1400*time.Millisecond {
		t.Errorf("globex's 4 events within %v, want about 1.5 s at its 2/s", span)
	}
	if n := len(sink.out.matching(`"path":"/unset"`)); n != 0 {
		t.Errorf("%d events went to the lane's own URL, not their receivers'", n)
	}
}

// TestRecipeWebhooks runs recipe 3: signed webhooks to the recipe's own
// receiver, which verifies them; an outage, a dead letter, a replay.
func TestRecipeWebhooks(t *testing.T) {
	t.Parallel()
	r := newRecipe(t, "docs/RECIPES.md", "webhooks")
	r.save("webhooks.yaml")
	r.save("receiver.go")
	r.export("env")
	receiver := r.start("receiver", "receiver listening")
	r.start("serve", `"throttler ready"`)

	as := answers(t, r.run("send"))
	admitted := 0
	for i, a := range as {
		if a.ID != fmt.Sprintf("evt-%d", i+1) {
			t.Fatalf("answer %d: %+v", i, a)
		}
		if a.State == "admitted" {
			admitted++
		}
	}
	if len(as) != 20 || admitted < 5 {
		t.Fatalf("%d answers, %d admitted; want 20, at least the burst of 5", len(as), admitted)
	}
	testenv.Eventually(t, 30*time.Second, "20 verified webhooks", func() bool {
		return len(receiver.out.matching("verified evt-")) >= 20
	})
	verified := receiver.out.matching("verified evt-")
	seen := map[string]bool{}
	for _, l := range verified {
		id := strings.Fields(l.text[strings.Index(l.text, "verified "):])[1]
		if seen[id] {
			t.Errorf("%s delivered twice", id)
		}
		seen[id] = true
	}
	if refused := receiver.out.matching("refused"); len(refused) > 0 {
		t.Fatalf("the receiver refused signatures: %v", refused)
	}
	// Beyond the admitted ones, 10/s.
	if span, want := verified[19].at.Sub(verified[0].at), time.Duration(20-admitted-1)*100*time.Millisecond*8/10; span < want {
		t.Errorf("20 webhooks with %d admitted arrived within %v; at 10/s that takes at least %v", admitted, span, want)
	}
	// The receiver refuses what is not signed with the secret.
	req, _ := http.NewRequest("POST", r.url("9000", "/webhook"), strings.NewReader(`{"forged":true}`))
	req.Header.Set("webhook-id", "forged-1")
	req.Header.Set("webhook-timestamp", strconv.FormatInt(time.Now().Unix(), 10))
	req.Header.Set("webhook-signature", "v1,c2lnbmVkIHdpdGggYW5vdGhlciBrZXk=")
	resp, err := pollClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("a forged signature was answered %d, want 401", resp.StatusCode)
	}

	// The receiver goes down: three attempts, then a dead letter.
	receiver.stop()
	if as := answers(t, r.run("send-one")); len(as) != 1 || as[0].ID != "evt-21" {
		t.Fatalf("answers %+v", as)
	}
	var dead struct {
		Dead []struct {
			ID        string `json:"id"`
			Reason    string `json:"reason"`
			Attempts  int    `json:"attempts"`
			LastError string `json:"last_error"`
		} `json:"dead"`
	}
	testenv.Eventually(t, 30*time.Second, "a dead letter", func() bool {
		if err := json.Unmarshal([]byte(r.run("dead")), &dead); err != nil {
			t.Fatal(err)
		}
		return len(dead.Dead) > 0
	})
	if d := dead.Dead[0]; len(dead.Dead) != 1 || d.ID != "evt-21" || d.Attempts != 3 || d.Reason != "failed 3 attempts" || !strings.Contains(d.LastError, "connection refused") {
		t.Fatalf("dead letters %+v; want evt-21 after 3 attempts, connection refused", dead.Dead)
	}

	// It is back: the replay reaches it, signed, with the same id.
	receiver = r.start("receiver", "receiver listening")
	if out := r.run("replay"); strings.TrimSpace(out) != `{"replayed":1,"until":1}` {
		t.Fatalf("replay printed %q", out)
	}
	testenv.Eventually(t, 20*time.Second, "the replayed webhook", func() bool {
		return len(receiver.out.matching("verified evt-21:")) == 1
	})
}

// TestReadmeQuickstart runs the README's burst against what `make run`
// starts (the sink and the service on configs/throttler.yaml): the output
// is two clean lines of counts and the lanes. Not parallel, so that it runs
// on a machine as quiet as the test run allows: a job is answered
// "admitted" only when it starts within 25 ms of being stored, so on a
// starved CPU fewer than the burst of 10 say so (and they are queued,
// honestly). The upper bound holds however loaded the machine is.
func TestReadmeQuickstart(t *testing.T) {
	r := newRecipe(t, "README.md", "readme")
	cfg, err := os.ReadFile("configs/throttler.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(r.dir, "configs"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(r.dir, "configs", "throttler.yaml"), []byte(r.subst.Replace(string(cfg))), 0o644); err != nil {
		t.Fatal(err)
	}
	// What make run starts.
	r.startCommand("sink", r.subst.Replace("bin/throttler sink --listen 127.0.0.1:9000"), `"sink listening"`)
	r.startCommand("serve", "bin/throttler serve --config configs/throttler.yaml", `"throttler ready"`)

	begin := time.Now()
	out := r.run("burst")
	took := time.Since(begin)
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	count := regexp.MustCompile(`^ *(\d+) "state":"(admitted|queued)"$`)
	if len(lines) != 3 || !count.MatchString(lines[0]) || !count.MatchString(lines[1]) {
		t.Fatalf("the burst printed %q; want two lines of counts, then the lanes", out)
	}
	n := map[string]int{}
	for _, line := range lines[:2] {
		m := count.FindStringSubmatch(line)
		n[m[2]], _ = strconv.Atoi(m[1])
	}
	// At most the burst of 10, plus one for every 50 ms the requests took.
	if most := 10 + int(took/(50*time.Millisecond)) + 1; n["admitted"] < 1 || n["admitted"] > most || n["admitted"]+n["queued"] != 100 {
		t.Fatalf("%d admitted and %d queued in %v; want 100, 1 to %d admitted", n["admitted"], n["queued"], took, most)
	}
	t.Logf("%d admitted, %d queued in %v", n["admitted"], n["queued"], took)
	if l := oneLane(t, lines[2]); l.Name != "demo" || l.Burst != 10 || l.Rate != 20 {
		t.Fatalf("lanes %+v", l)
	}
}

// pollClient bounds every request of the tests, so that a server that
// stops answering fails the test instead of hanging it until -timeout.
var pollClient = &http.Client{Timeout: 5 * time.Second}

// getLane reads the one lane from GET /v1/lanes.
func getLane(t *testing.T, url string) laneState {
	t.Helper()
	resp, err := pollClient.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return oneLane(t, string(body))
}
