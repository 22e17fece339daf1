package throttler_test

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// natsCLI is a stand-in for the nats command line tool
// (github.com/nats-io/natscli), for the part of it that docs/RECIPES.md
// uses, and that the trust tests use as an attacker would: `pub` (with
// --jetstream, or --reply), `reply` and `sub` (with --count), with the
// global --server, --user, --password and --inbox-prefix flags, written as
// the tool writes them. The recipe
// tests put the test binary on PATH under the name nats, so that the
// recipes' commands run as written without downloading the tool. It prints
// what the tool prints, on stderr as the tool does. Any other command or flag
// is refused, so that a recipe cannot use a form the tests do not run.
func natsCLI(args []string, stderr io.Writer) int {
	logf := func(format string, a ...any) {
		fmt.Fprintf(stderr, "%s %s\n", time.Now().Format("15:04:05"), fmt.Sprintf(format, a...))
	}
	fail := func(err error) int {
		fmt.Fprintf(stderr, "nats: error: %v\n", err)
		return 1
	}
	c := natsCommand{server: os.Getenv("NATS_URL"), user: os.Getenv("NATS_USER"), password: os.Getenv("NATS_PASSWORD"), queue: "NATS-RPLY-22"}
	if err := c.parse(args); err != nil {
		return fail(fmt.Errorf("%w (this nats is the test stand-in in natscli_test.go: it knows pub, reply and sub only)", err))
	}
	if c.server == "" {
		c.server = nats.DefaultURL
	}
	var asyncErr atomic.Pointer[error] // a permissions violation arrives on its own
	violation := make(chan struct{}, 1)
	opts := []nats.Option{nats.UserInfo(c.user, c.password), nats.Name("nats stand-in"),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			asyncErr.Store(&err)
			select {
			case violation <- struct{}{}:
			default:
			}
		})}
	if c.inboxPrefix != "" {
		opts = append(opts, nats.CustomInboxPrefix(c.inboxPrefix))
	}
	nc, err := nats.Connect(c.server, opts...)
	if err != nil {
		return fail(err)
	}
	defer nc.Close()
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()

	switch c.command {
	case "pub", "publish":
		msg := nats.NewMsg(c.subject)
		msg.Reply = c.reply
		msg.Data = []byte(c.body)
		for _, h := range c.headers {
			msg.Header.Add(h[0], h[1])
		}
		if !c.jetstream {
			if err := nc.PublishMsg(msg); err != nil {
				return fail(err)
			}
			if err := nc.Flush(); err != nil {
				return fail(err)
			}
			if err := nc.LastError(); err != nil {
				return fail(err)
			}
			if e := asyncErr.Load(); e != nil {
				return fail(*e)
			}
			logf("Published %d bytes to %q", len(msg.Data), c.subject)
			return 0
		}
		js, err := jetstream.New(nc)
		if err != nil {
			return fail(err)
		}
		pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		ack, err := js.PublishMsg(pctx, msg)
		if err != nil {
			if e := asyncErr.Load(); e != nil {
				err = *e
			}
			return fail(err)
		}
		logf("Published %d bytes to %q", len(msg.Data), c.subject)
		dup := ""
		if ack.Duplicate {
			dup = " Duplicate: true"
		}
		logf("Stored in Stream: %s Sequence: %d%s", ack.Stream, ack.Sequence, dup)
		return 0
	case "sub", "subscribe":
		n := 0
		done := make(chan struct{})
		_, err := nc.Subscribe(c.subject, func(m *nats.Msg) {
			n++
			logf("[#%d] Received on %q\n%s", n, m.Subject, m.Data)
			if c.count > 0 && n == c.count {
				close(done)
			}
		})
		if err != nil {
			return fail(err)
		}
		if err := nc.Flush(); err != nil {
			return fail(err)
		}
		logf("Subscribing on %s", c.subject)
		select {
		case <-ctx.Done():
		case <-done:
		case <-violation:
			// The server refused the subscription: the tool reports it and ends.
			return fail(*asyncErr.Load())
		}
		return 0
	case "reply":
		n := 0
		done := make(chan struct{})
		_, err := nc.QueueSubscribe(c.subject, c.queue, func(m *nats.Msg) {
			var b strings.Builder
			fmt.Fprintf(&b, "[#%d] Received on subject %q:\n", n, m.Subject)
			keys := make([]string, 0, len(m.Header))
			for k := range m.Header {
				keys = append(keys, k)
			}
			slices.Sort(keys)
			for _, k := range keys {
				for _, v := range m.Header[k] {
					fmt.Fprintf(&b, "%s %s: %s\n", time.Now().Format("15:04:05"), k, v)
				}
			}
			logf("%s\n%s", b.String(), m.Data)
			reply := nats.NewMsg(m.Reply)
			reply.Data = []byte(c.body)
			for _, h := range c.headers {
				reply.Header.Add(h[0], h[1])
			}
			if err := m.RespondMsg(reply); err != nil {
				logf("reply failed: %v", err)
			}
			n++
			if c.count > 0 && n == c.count {
				close(done)
			}
		})
		if err != nil {
			return fail(err)
		}
		if err := nc.Flush(); err != nil {
			return fail(err)
		}
		logf("Listening on %q in group %q", c.subject, c.queue)
		select {
		case <-ctx.Done():
		case <-done:
		}
		return 0
	}
	return fail(fmt.Errorf("unknown command %q", c.command))
}

// natsCommand is a parsed nats command line.
type natsCommand struct {
	server, user, password string
	inboxPrefix, reply     string
	command, subject, body string
	headers                [][2]string
	jetstream              bool
	queue                  string
	count                  int
}

// parse reads args as the nats tool does: flags before or after the
// command, --flag=value or --flag value.
func (c *natsCommand) parse(args []string) error {
	var positional []string
	for i := 0; i < len(args); i++ {
		arg := args[i]
		name, value, inline := strings.Cut(arg, "=")
		if !strings.HasPrefix(arg, "--") {
			name, inline = arg, false
		}
		next := func() (string, error) {
			if inline {
				return value, nil
			}
			if i+1 >= len(args) {
				return "", fmt.Errorf("flag %s needs a value", name)
			}
			i++
			return args[i], nil
		}
		var err error
		switch name {
		case "-s", "--server":
			c.server, err = next()
		case "--user":
			c.user, err = next()
		case "--password":
			c.password, err = next()
		case "--inbox-prefix":
			c.inboxPrefix, err = next()
		case "--reply":
			c.reply, err = next()
		case "-H", "--header":
			var h string
			if h, err = next(); err == nil {
				k, v, ok := strings.Cut(h, ":")
				if !ok {
					return fmt.Errorf("header %q is not K:V", h)
				}
				c.headers = append(c.headers, [2]string{strings.TrimSpace(k), strings.TrimSpace(v)})
			}
		case "-J", "--jetstream":
			c.jetstream = true
		case "-q", "--queue":
			c.queue, err = next()
		case "--count":
			var s string
			if s, err = next(); err == nil {
				c.count, err = strconv.Atoi(s)
			}
		default:
			if strings.HasPrefix(arg, "-") {
				return fmt.Errorf("unknown flag %s", arg)
			}
			positional = append(positional, arg)
		}
		if err != nil {
			return err
		}
	}
	if len(positional) < 2 || len(positional) > 3 {
		return fmt.Errorf("want: nats [flags] pub|reply|sub SUBJECT [BODY], got %q", args)
	}
	c.command, c.subject = positional[0], positional[1]
	if len(positional) == 3 {
		c.body = positional[2]
	} else if c.command == "pub" || c.command == "publish" {
		return fmt.Errorf("pub without a body reads stdin")
	}
	if strings.Contains(c.subject+c.body, "{{") {
		return fmt.Errorf("templates in the subject or body are not supported")
	}
	isPub := c.command == "pub" || c.command == "publish"
	if c.jetstream && !isPub {
		return fmt.Errorf("--jetstream is a flag of pub")
	}
	if c.reply != "" && (!isPub || c.jetstream) {
		return fmt.Errorf("--reply is a flag of pub without --jetstream")
	}
	if (c.command == "sub" || c.command == "subscribe") && (c.body != "" || len(c.headers) > 0 || c.queue != "NATS-RPLY-22") {
		return fmt.Errorf("sub takes a subject and --count only")
	}
	if isPub && (c.count != 0 || c.queue != "NATS-RPLY-22") {
		return fmt.Errorf("--count and --queue are not supported with pub")
	}
	return nil
}
