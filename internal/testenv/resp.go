package testenv

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"time"
)

// respError is an error reply of a Redis server ("-ERR …").
type respError string

func (e respError) Error() string { return string(e) }

// do sends one command to the Redis server (or sentinel) at addr over a
// fresh connection and returns its reply: a string for a simple string or
// a bulk string, nil for a null, an int64, a []any for an array, or an
// error (a respError for an error reply).
func do(addr string, args ...string) (any, error) {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	if err := c.SetDeadline(time.Now().Add(2 * time.Second)); err != nil {
		return nil, err
	}
	var b strings.Builder
	fmt.Fprintf(&b, "*%d\r\n", len(args))
	for _, a := range args {
		fmt.Fprintf(&b, "$%d\r\n%s\r\n", len(a), a)
	}
	if _, err := io.WriteString(c, b.String()); err != nil {
		return nil, err
	}
	v, err := readReply(bufio.NewReader(c))
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", addr, strings.Join(args, " "), err)
	}
	if e, ok := v.(respError); ok {
		return nil, fmt.Errorf("%s %s: %w", addr, strings.Join(args, " "), e)
	}
	return v, nil
}

// doString is do for a command whose reply is a string.
func doString(addr string, args ...string) (string, error) {
	v, err := do(addr, args...)
	if err != nil {
		return "", err
	}
	s, ok := v.(string)
	if !ok {
		return "", fmt.Errorf("%s %s: reply %v is not a string", addr, strings.Join(args, " "), v)
	}
	return s, nil
}

// readReply reads one RESP2 reply. An error reply is returned as a value
// (respError) so that arrays of replies keep their shape.
func readReply(r *bufio.Reader) (any, error) {
	line, err := r.ReadString('\n')
	if err != nil {
		return nil, err
	}
	line = strings.TrimSuffix(line, "\r\n")
	if line == "" {
		return nil, fmt.Errorf("empty reply line")
	}
	body := line[1:]
	switch line[0] {
	case '+':
		return body, nil
	case '-':
		return respError(body), nil
	case ':':
		return strconv.ParseInt(body, 10, 64)
	case '$':
		n, err := strconv.Atoi(body)
		if err != nil || n < 0 {
			return nil, err // $-1 is a null bulk string
		}
		buf := make([]byte, n+2)
		if _, err := io.ReadFull(r, buf); err != nil {
			return nil, err
		}
		return string(buf[:n]), nil
	case '*':
		n, err := strconv.Atoi(body)
		if err != nil || n < 0 {
			return nil, err // *-1 is a null array
		}
		out := make([]any, n)
		for i := range out {
			if out[i], err = readReply(r); err != nil {
				return nil, err
			}
		}
		return out, nil
	}
	return nil, fmt.Errorf("unexpected reply line %q", line)
}

// infoField returns one field of an INFO or CLUSTER INFO reply.
func infoField(info, field string) string {
	for line := range strings.SplitSeq(info, "\n") {
		if k, v, ok := strings.Cut(strings.TrimSpace(line), ":"); ok && k == field {
			return v
		}
	}
	return ""
}

// fieldMap turns a flat array of field names and values (SENTINEL MASTER,
// SENTINEL REPLICAS entries) into a map.
func fieldMap(v any) map[string]string {
	a, _ := v.([]any)
	m := make(map[string]string, len(a)/2)
	for i := 0; i+1 < len(a); i += 2 {
		k, _ := a[i].(string)
		val, _ := a[i+1].(string)
		m[k] = val
	}
	return m
}

// RedisDo sends one command to the Redis server at addr over a connection
// of its own and returns the reply: a string, an int64, nil or a []any of
// those. An error reply is returned as an error.
func RedisDo(addr string, args ...string) (any, error) { return do(addr, args...) }
