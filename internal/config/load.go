package config

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/throttler/throttler/internal/bucket"
	"go.yaml.in/yaml/v3"
)

// Load reads path, resolves the _env and _file forms of secret fields
// (secrets.go; variables through getenv), applies env overrides through
// getenv (THROTTLER_LISTEN, THROTTLER_NATS_URL, THROTTLER_NATS_DATA_DIR,
// THROTTLER_NATS_LISTEN, THROTTLER_REDIS_URL, THROTTLER_LOG_LEVEL), fills
// defaults, validates, and reads auth.keys_file to check it.
func Load(path string, getenv func(string) string) (Config, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return Config{}, fmt.Errorf("config: %w", err)
	}
	return Parse(path, raw, getenv)
}

// Parse is Load on bytes already read; path only names the source in errors.
func Parse(path string, raw []byte, getenv func(string) string) (Config, error) {
	cfg := Default()
	if err := oneDocument(raw); err != nil {
		return Config{}, inFile(err, path)
	}
	if err := decodeStrict(raw, &cfg, configSecret, getenv); err != nil {
		return Config{}, inFile(err, path)
	}
	cfg.getenv = getenv
	if getenv != nil {
		for env, dst := range map[string]*string{
			"THROTTLER_LISTEN":        &cfg.Listen,
			"THROTTLER_NATS_URL":      &cfg.NATS.URL,
			"THROTTLER_NATS_DATA_DIR": &cfg.NATS.DataDir,
			"THROTTLER_NATS_LISTEN":   &cfg.NATS.Listen,
			"THROTTLER_REDIS_URL":     &cfg.Redis.URL,
			"THROTTLER_LOG_LEVEL":     &cfg.Log.Level,
		} {
			if v, ok := lookup(getenv, env); ok {
				*dst = v
			}
		}
	}
	cfg.ApplyDefaults()
	if err := cfg.Validate(); err != nil {
		var ce *Error
		if errors.As(err, &ce) {
			ce.File = path
		}
		return Config{}, err
	}
	// The keys file is read again by the service (and on SIGHUP); reading
	// it here refuses a bad one before anything starts.
	if _, err := cfg.LoadKeys(); err != nil {
		var ce *Error
		if errors.As(err, &ce) && ce.File == "" {
			ce.File = path
		}
		return Config{}, err
	}
	return cfg, nil
}

func secondDocument(line int) string {
	msg := "a second YAML document (after ---)"
	if line > 0 {
		msg = fmt.Sprintf("line %d: %s", line, msg)
	}
	return msg + " is not allowed: the file holds exactly one config"
}

// valueError is the error of a value type's UnmarshalYAML (Duration,
// ByteSize): the decoder returns it as is, and Parse finds the field at its
// position to name it.
type valueError struct {
	line, column int
	msg          string
}

func (e *valueError) Error() string { return fmt.Sprintf("line %d: %s", e.line, e.msg) }

func badValue(n *yaml.Node, format string, args ...any) error {
	return &valueError{line: n.Line, column: n.Column, msg: fmt.Sprintf(format, args...)}
}

// findField returns the path (lanes[0].max_bytes) and node of the first
// scalar value of raw's first document, in document order, that match
// accepts, or "" and nil.
func findField(raw []byte, match func(path string, n *yaml.Node) bool) (string, *yaml.Node) {
	var doc yaml.Node
	if yaml.Unmarshal(raw, &doc) != nil || len(doc.Content) == 0 {
		return "", nil
	}
	var walk func(n *yaml.Node, path string) (string, *yaml.Node)
	walk = func(n *yaml.Node, path string) (string, *yaml.Node) {
		switch n.Kind {
		case yaml.ScalarNode:
			if path != "" && match(path, n) {
				return path, n
			}
		case yaml.MappingNode:
			for i := 0; i+1 < len(n.Content); i += 2 {
				key := n.Content[i].Value
				if path != "" {
					key = path + "." + key
				}
				if p, m := walk(n.Content[i+1], key); m != nil {
					return p, m
				}
			}
		case yaml.SequenceNode:
			for i, c := range n.Content {
				if p, m := walk(c, fmt.Sprintf("%s[%d]", path, i)); m != nil {
					return p, m
				}
			}
		}
		return "", nil
	}
	return walk(doc.Content[0], "")
}

// sections names the Go types of the config in the words of the file.
var sections = strings.NewReplacer(
	"in type config.Config", "at the top level",
	"in type config.NATS", "in nats",
	"in type config.Redis", "in redis",
	"in type config.Dispatch", "in dispatch",
	"in type config.Log", "in log",
	"in type config.Lane", "in a lane",
	"in type config.Quota", "in a lane's quota",
	"into bucket.Rate", "into a rate",
	"in type config.Target", "in a lane's target",
	"in type config.HTTPTarget", "in target.http",
	"in type config.NATSTarget", "in target.nats",
	"in type config.Retry", "in a lane's retry",
	"in type config.Adaptive", "in a lane's adaptive",
	"in type config.DeadLetters", "in dead_letters",
	"in type config.Auth", "in auth",
	"in type config.Key", "in a key",
	"in type config.TLS", "in tls",
	"in type config.HTTP", "in http",
	"in type config.Callers", "in callers",
	"in type config.PerIP", "in callers.per_ip",
	"in type config.Plan", "in a plan",
)

// yamlMessage turns a decoder error into one line per problem, each with its
// line number, in the file's own vocabulary.
func yamlMessage(err error) string {
	var te *yaml.TypeError
	if errors.As(err, &te) {
		return sections.Replace(strings.Join(te.Errors, "; "))
	}
	return sections.Replace(strings.TrimPrefix(err.Error(), "yaml: "))
}

func lookup(getenv func(string) string, key string) (string, bool) {
	v := getenv(key)
	return v, v != ""
}

// oneDocument refuses a file with a second YAML document: it would be
// silently ignored.
func oneDocument(raw []byte) error {
	dec := yaml.NewDecoder(bytes.NewReader(raw))
	var first, next yaml.Node
	if err := dec.Decode(&first); err != nil {
		return nil // an empty file, or a syntax error the decode reports
	}
	if err := dec.Decode(&next); !errors.Is(err, io.EOF) {
		line := next.Line
		if err != nil {
			line = 0
		}
		return &Error{Msg: secondDocument(line)}
	}
	return nil
}

// decodeError describes a decoding error in the file's words, naming the
// field where it can: a bad value (duration, size) knows its line and
// column; bucket.Rate reads its own text and does not know where it is, so
// the field is the first rate in the file that does not parse.
func decodeError(raw []byte, err error) error {
	var ve *valueError
	if errors.As(err, &ve) {
		field, _ := findField(raw, func(_ string, n *yaml.Node) bool { return n.Line == ve.line && n.Column == ve.column })
		return &Error{Field: field, Msg: ve.Error(), Err: err}
	}
	var re *bucket.RateError
	if errors.As(err, &re) {
		field, n := findField(raw, func(path string, n *yaml.Node) bool {
			_, err := bucket.ParseRate(n.Value)
			return laneRate.MatchString(path) && err != nil
		})
		if n != nil {
			return &Error{Field: field, Msg: fmt.Sprintf("line %d: %v", n.Line, err), Err: err}
		}
		return &Error{Msg: err.Error(), Err: err}
	}
	return &Error{Msg: yamlMessage(err), Err: err}
}
