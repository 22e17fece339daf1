package config

import (
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"reflect"
	"slices"
	"strings"

	"go.yaml.in/yaml/v3"
)

// A secret field of the file may be given in one of three forms:
//
//	url: redis://:pw@redis:6379/0          # inline
//	url_env: REDIS_URL                     # from an environment variable
//	url_file: /run/secrets/redis-url       # from a file (a trailing newline is dropped)
//
// The _env and _file forms are resolved once, on the YAML node tree, before
// the tree is decoded: every secret field gets them without code of its own.

// maxSecretFile bounds what a _file secret may hold.
const maxSecretFile = 1 << 20

// secretKind says whether a field is a secret, and of which shape.
type secretKind int

const (
	notSecret secretKind = iota
	secretValue
	// secretList: a list of secrets; its _env / _file form names one
	// variable or file per entry.
	secretList
)

// configSecret says whether field (indices written as []) of the config
// file is a secret that may come from the environment or a file.
func configSecret(field string) secretKind {
	switch {
	case field == "lanes[].target.http.signing_secrets":
		return secretList
	case field == "nats.url", field == "redis.url", field == "auth.keys[].sha256",
		field == "nats.password", field == "nats.publishers[].password", field == "nats.workers[].password", field == "nats.pull_login.password",
		strings.HasPrefix(field, "lanes[].target.http.headers."):
		return secretValue
	}
	return notSecret
}

// keysFileSecret is configSecret for a keys_file, a list of keys.
func keysFileSecret(field string) secretKind {
	if field == "[].sha256" {
		return secretValue
	}
	return notSecret
}

// decodeStrict decodes raw YAML into v (a pointer), refusing unknown fields,
// after resolving the _env and _file forms of the fields secret names.
// Errors are *Error values without File.
func decodeStrict(raw []byte, v any, secret func(field string) secretKind, getenv func(string) string) error {
	var root yaml.Node
	if err := yaml.Unmarshal(raw, &root); err != nil {
		return &Error{Msg: yamlMessage(err), Err: err}
	}
	if root.Kind == 0 {
		return nil // empty document
	}
	r := resolver{secret: secret, getenv: getenv, resolved: map[string]bool{}}
	if err := r.walk(&root, "", ""); err != nil {
		return err
	}
	// The node tree cannot be decoded with unknown fields refused (yaml.v3
	// has that only on a Decoder, which reads bytes), so the bytes are
	// decoded strictly into a scratch value for the errors, less the
	// sibling keys just resolved, and the resolved tree into v.
	scratch := reflect.New(reflect.TypeOf(v).Elem()).Interface()
	dec := yaml.NewDecoder(strings.NewReader(string(raw)))
	dec.KnownFields(true)
	if err := dec.Decode(scratch); err != nil && !errors.Is(err, io.EOF) {
		var te *yaml.TypeError
		if !errors.As(err, &te) {
			return decodeError(raw, err)
		}
		var left []string
		for _, e := range te.Errors {
			if !r.isResolved(e) {
				left = append(left, e)
			}
		}
		if len(left) > 0 {
			return &Error{Msg: yamlMessage(&yaml.TypeError{Errors: left})}
		}
	}
	if err := root.Decode(v); err != nil {
		return decodeError(raw, err)
	}
	return nil
}

// resolver replaces name_env / name_file siblings of secret fields with the
// value they point to.
type resolver struct {
	secret func(string) secretKind
	getenv func(string) string
	// resolved holds "line N: field K not found" for each sibling key
	// replaced, so that the strict decode's complaint about it is dropped.
	resolved map[string]bool
}

func (r *resolver) isResolved(yamlErr string) bool {
	head, _, ok := strings.Cut(yamlErr, " not found in ")
	return ok && r.resolved[head]
}

// walk visits n; path is its field path with indices ("lanes[0].target"),
// norm the same with bare brackets ("lanes[].target").
func (r *resolver) walk(n *yaml.Node, path, norm string) error {
	switch n.Kind {
	case yaml.DocumentNode:
		for _, c := range n.Content {
			if err := r.walk(c, path, norm); err != nil {
				return err
			}
		}
	case yaml.SequenceNode:
		for i, c := range n.Content {
			if err := r.walk(c, fmt.Sprintf("%s[%d]", path, i), norm+"[]"); err != nil {
				return err
			}
		}
	case yaml.MappingNode:
		join := func(p, k string) string {
			if p == "" {
				return k
			}
			return p + "." + k
		}
		for i := 0; i+1 < len(n.Content); i += 2 {
			if n.Content[i].Kind != yaml.ScalarNode {
				continue
			}
			if err := r.sibling(n, i, join(path, ""), join(norm, "")); err != nil {
				return err
			}
			k, val := n.Content[i], n.Content[i+1]
			if err := r.walk(val, join(path, k.Value), join(norm, k.Value)); err != nil {
				return err
			}
		}
	}
	return nil
}

// sibling resolves the key at m.Content[i] if it is the _env or _file form
// of a secret field; prefix and normPrefix end in "." (or are empty).
func (r *resolver) sibling(m *yaml.Node, i int, prefix, normPrefix string) error {
	k, val := m.Content[i], m.Content[i+1]
	var base, form string
	switch {
	case strings.HasSuffix(k.Value, "_env"):
		base, form = strings.TrimSuffix(k.Value, "_env"), "env"
	case strings.HasSuffix(k.Value, "_file"):
		base, form = strings.TrimSuffix(k.Value, "_file"), "file"
	default:
		return nil
	}
	kind := notSecret
	if base != "" {
		kind = r.secret(normPrefix + base)
	}
	if kind == notSecret {
		return nil // an ordinary field; the decoder judges it
	}
	field := prefix + k.Value
	fail := func(format string, args ...any) error {
		return &Error{Field: field, Msg: fmt.Sprintf(format, args...)}
	}
	for j := 0; j+1 < len(m.Content); j += 2 {
		if o := m.Content[j].Value; j != i && (o == base || o == base+"_env" || o == base+"_file") {
			return fail("give only one of %s, %s_env and %s_file", base, base, base)
		}
	}
	// A list field (signing_secrets) takes one name or a list of names, one
	// secret each.
	refs := []*yaml.Node{val}
	if kind == secretList && val.Kind == yaml.SequenceNode {
		refs = val.Content
	}
	var values []*yaml.Node
	for _, ref := range refs {
		if ref.Kind != yaml.ScalarNode || ref.Value == "" {
			return fail("must name an environment variable or a file")
		}
		v, err := r.read(form, ref.Value)
		if err != nil {
			return fail("%v", err)
		}
		values = append(values, &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: v, Line: ref.Line, Column: ref.Column})
	}
	r.resolved[fmt.Sprintf("line %d: field %s", k.Line, k.Value)] = true
	m.Content[i] = &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: base, Line: k.Line, Column: k.Column}
	if kind == secretList {
		m.Content[i+1] = &yaml.Node{Kind: yaml.SequenceNode, Tag: "!!seq", Content: values, Line: val.Line, Column: val.Column}
	} else {
		m.Content[i+1] = values[0]
	}
	return nil
}

// read returns the secret held by an environment variable or a file, with
// one trailing newline dropped. Errors never hold the secret.
func (r *resolver) read(form, ref string) (string, error) {
	if form == "env" {
		var v string
		if r.getenv != nil {
			v = r.getenv(ref)
		}
		if v == "" {
			return "", fmt.Errorf("environment variable %s is not set or empty", ref)
		}
		return v, nil
	}
	f, err := os.Open(ref)
	if err != nil {
		return "", err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxSecretFile+1))
	if err != nil {
		return "", fmt.Errorf("read %s: %w", ref, err)
	}
	if len(b) > maxSecretFile {
		return "", fmt.Errorf("%s is larger than %d bytes", ref, maxSecretFile)
	}
	s := strings.TrimSuffix(strings.TrimSuffix(string(b), "\n"), "\r")
	if s == "" {
		return "", fmt.Errorf("%s is empty", ref)
	}
	return s, nil
}

// RedactURL hides the secrets of a URL, or of a comma-separated list of
// URLs (nats.url): a password becomes *** (user:***@host), a user without a
// password (a token) becomes ***, and every query value becomes ***
// (?master_name=***&addr=***). It does not need a valid URL: a string that
// url.Parse refuses is redacted the same way, so that it can be quoted in
// the error that refuses it.
func RedactURL(s string) string {
	parts := strings.Split(s, ",")
	for i, p := range parts {
		parts[i] = redactOne(p)
	}
	return strings.Join(parts, ",")
}

func redactOne(s string) string {
	scheme, rest, ok := strings.Cut(s, "://")
	if !ok {
		scheme, rest = "", s
	} else {
		scheme += "://"
	}
	// The user info ends at the last @ (a password may hold / ? # or @).
	if at := strings.LastIndex(rest, "@"); at >= 0 {
		user, _, hasPass := strings.Cut(rest[:at], ":")
		if hasPass {
			rest = user + ":***@" + rest[at+1:]
		} else {
			rest = "***@" + rest[at+1:]
		}
	}
	if frag := strings.IndexByte(rest, '#'); frag >= 0 {
		rest = rest[:frag]
	}
	base, query, hasQuery := strings.Cut(rest, "?")
	if !hasQuery {
		return scheme + rest
	}
	var kept []string
	for _, kv := range strings.Split(query, "&") {
		if kv == "" {
			continue
		}
		k, _, _ := strings.Cut(kv, "=")
		if uk, err := url.QueryUnescape(k); err == nil && safeName(uk) {
			kept = append(kept, uk+"=***")
		} else {
			kept = append(kept, "***")
		}
	}
	return scheme + base + "?" + strings.Join(kept, "&")
}

// safeName: a query parameter name shown as is (letters, digits, _ - .).
func safeName(s string) bool {
	if s == "" || len(s) > 64 {
		return false
	}
	for _, c := range s {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-' || c == '.') {
			return false
		}
	}
	return true
}

// ScrubURL returns msg with every secret of rawURL (as RedactURL hides
// them) replaced by ***, and rawURL itself by its redacted form: for
// errors from clients that quote the URL they were given.
func ScrubURL(msg, rawURL string) string {
	if rawURL == "" {
		return msg
	}
	msg = strings.ReplaceAll(msg, rawURL, RedactURL(rawURL))
	for _, s := range urlSecrets(rawURL) {
		msg = strings.ReplaceAll(msg, s, "***")
		if e := url.QueryEscape(s); e != s {
			msg = strings.ReplaceAll(msg, e, "***")
		}
		if u, err := url.PathUnescape(s); err == nil && u != s {
			msg = strings.ReplaceAll(msg, u, "***")
		}
	}
	return msg
}

// urlSecrets lists the passwords and tokens of a URL list, and the values
// of query parameters named like secrets (password=, token=, …), longest
// first so that a secret containing another is replaced whole. Values
// shorter than 3 bytes are left out: replacing them everywhere would
// mangle the message, and the whole URL is replaced anyway.
func urlSecrets(s string) []string {
	var out []string
	add := func(v string) {
		if len(v) >= 3 {
			out = append(out, v)
		}
	}
	for _, p := range strings.Split(s, ",") {
		_, rest, ok := strings.Cut(p, "://")
		if !ok {
			rest = p
		}
		if at := strings.LastIndex(rest, "@"); at >= 0 {
			user, pass, hasPass := strings.Cut(rest[:at], ":")
			if !hasPass {
				pass = user
			}
			add(pass)
			rest = rest[at+1:]
		}
		if _, q, ok := strings.Cut(rest, "?"); ok {
			for _, kv := range strings.Split(q, "&") {
				k, v, ok := strings.Cut(kv, "=")
				if ok && secretParam(strings.ToLower(k)) {
					add(v)
				}
			}
		}
	}
	slices.SortFunc(out, func(a, b string) int { return len(b) - len(a) })
	return out
}

// secretParam: a query parameter name that suggests a credential.
func secretParam(name string) bool {
	for _, w := range []string{"pass", "pwd", "token", "secret", "key", "auth", "cred"} {
		if strings.Contains(name, w) {
			return true
		}
	}
	return false
}
