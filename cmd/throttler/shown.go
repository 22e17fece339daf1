package main

import (
	"fmt"
	"strings"
	"unicode/utf8"
)

// shown is s as the CLI prints it for a person: a string the server relays
// from elsewhere (a target's answer: its body, kept headers, status text in
// a dead letter's last error) may hold terminal escape sequences, which
// would otherwise drive the operator's terminal (clear the screen, rewrite
// what was printed above, set the window title or the clipboard). Control
// characters other than newline and tab (C0, DEL, C1) and bytes that are
// not UTF-8 are written as Go escapes (\x1b, \u009b); the rest is kept.
func shown(s string) string {
	if !needsEscape(s) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && n == 1:
			fmt.Fprintf(&b, `\x%02x`, s[i])
		case unsafeRune(r):
			if r < 0x80 {
				fmt.Fprintf(&b, `\x%02x`, r)
			} else {
				fmt.Fprintf(&b, `\u%04x`, r)
			}
		default:
			b.WriteString(s[i : i+n])
		}
		i += n
	}
	return b.String()
}

// needsEscape reports whether shown changes s.
func needsEscape(s string) bool {
	return !utf8.ValidString(s) || strings.ContainsFunc(s, unsafeRune)
}

// unsafeRune: a control character a terminal may act on (every C0 control
// but newline and tab, DEL, and the C1 controls U+0080–U+009F).
func unsafeRune(r rune) bool {
	return r < 0x20 && r != '\n' && r != '\t' || r >= 0x7f && r <= 0x9f
}

// cell is shown for a column of a table: a tab and a newline are escaped
// too, so that neither moves the columns or rows after it.
func cell(s string) string { return cellEscapes.Replace(shown(s)) }

var cellEscapes = strings.NewReplacer("\t", `\t`, "\n", `\n`)
