package canon

import (
	"unicode/utf8"
)

// plain marks the ASCII bytes a string can carry through unchanged: not a
// quote, not a backslash, not a control character.
var plain = func() (t [utf8.RuneSelf]bool) {
	for c := 0x20; c < utf8.RuneSelf; c++ {
		t[c] = c != '"' && c != '\\'
	}
	return t
}()

// str reads the string whose opening quote is at src[i], appends its
// canonical form to out and returns the offset past the closing quote and
// whether the source used any escape.
func (s *state) str(i int) (int, bool, error) {
	src := s.src
	open := i
	s.out = append(s.out, '"')
	i++
	esc := false
	for {
		start := i
		for i < len(src) {
			c := src[i]
			if c < utf8.RuneSelf {
				if !plain[c] {
					break
				}
				i++
				continue
			}
			r, n := utf8.DecodeRune(src[i:])
			if r == utf8.RuneError && n <= 1 {
				return i, esc, fail(ErrInvalidUTF8, i, "byte 0x%02x in a string is not UTF-8", c)
			}
			i += n
		}
		s.out = append(s.out, src[start:i]...)
		if i >= len(src) {
			return i, esc, fail(ErrSyntax, open, "string is not terminated")
		}
		switch c := src[i]; c {
		case '"':
			s.out = append(s.out, '"')
			return i + 1, esc, nil
		case '\\':
			esc = true
			var err error
			if i, err = s.escape(i); err != nil {
				return i, esc, err
			}
		default:
			return i, esc, fail(ErrSyntax, i, "control character 0x%02x in a string must be escaped", c)
		}
	}
}

// escape decodes the escape sequence at src[i] and appends its canonical
// form to out.
func (s *state) escape(i int) (int, error) {
	src := s.src
	if i+1 >= len(src) {
		return i, fail(ErrSyntax, i, "string is not terminated")
	}
	var r rune
	switch src[i+1] {
	case '"', '\\':
		s.out = append(s.out, '\\', src[i+1])
		return i + 2, nil
	case '/':
		s.out = append(s.out, '/')
		return i + 2, nil
	case 'b':
		r = '\b'
	case 'f':
		r = '\f'
	case 'n':
		r = '\n'
	case 'r':
		r = '\r'
	case 't':
		r = '\t'
	case 'u':
		hi, ok := hex4(src, i+2)
		if !ok {
			return i, fail(ErrSyntax, i, `\u must be followed by four hex digits`)
		}
		switch {
		case hi >= 0xDC00 && hi <= 0xDFFF:
			return i, fail(ErrLoneSurrogate, i, `\u%04x is a low surrogate without a high one before it`, hi)
		case hi >= 0xD800 && hi <= 0xDBFF:
			lo, ok := rune(0), false
			if i+7 < len(src) && src[i+6] == '\\' && src[i+7] == 'u' {
				lo, ok = hex4(src, i+8)
			}
			if !ok || lo < 0xDC00 || lo > 0xDFFF {
				return i, fail(ErrLoneSurrogate, i, `\u%04x is a high surrogate without a low one after it`, hi)
			}
			s.out = utf8.AppendRune(s.out, 0x10000+(hi-0xD800)<<10+(lo-0xDC00))
			return i + 12, nil
		}
		s.out = appendEscaped(s.out, hi)
		return i + 6, nil
	default:
		return i, fail(ErrSyntax, i, "invalid escape \\%c", rune(src[i+1]))
	}
	s.out = appendEscaped(s.out, r)
	return i + 2, nil
}

func hex4(b []byte, i int) (rune, bool) {
	if i+4 > len(b) {
		return 0, false
	}
	var r rune
	for _, c := range b[i : i+4] {
		switch {
		case c >= '0' && c <= '9':
			c -= '0'
		case c >= 'a' && c <= 'f':
			c -= 'a' - 10
		case c >= 'A' && c <= 'F':
			c -= 'A' - 10
		default:
			return 0, false
		}
		r = r<<4 | rune(c)
	}
	return r, true
}

const hexDigits = "0123456789abcdef"

// appendEscaped writes one decoded code point the way JSON.stringify does:
// the two-character escapes where ECMAScript has one, \u00xx (lower-case)
// for the other control characters, everything else as UTF-8.
func appendEscaped(out []byte, r rune) []byte {
	switch r {
	case '"', '\\':
		return append(out, '\\', byte(r))
	case '\b':
		return append(out, '\\', 'b')
	case '\f':
		return append(out, '\\', 'f')
	case '\n':
		return append(out, '\\', 'n')
	case '\r':
		return append(out, '\\', 'r')
	case '\t':
		return append(out, '\\', 't')
	}
	if r < 0x20 {
		return append(out, '\\', 'u', '0', '0', hexDigits[r>>4], hexDigits[r&0xF])
	}
	return utf8.AppendRune(out, r)
}

// unescape appends the text of a canonical string body (as str writes it)
// to dst. Only the escapes appendEscaped produces can occur.
func unescape(dst, b []byte) []byte {
	for i := 0; i < len(b); i++ {
		c := b[i]
		if c != '\\' {
			dst = append(dst, c)
			continue
		}
		i++
		switch b[i] {
		case 'b':
			dst = append(dst, '\b')
		case 'f':
			dst = append(dst, '\f')
		case 'n':
			dst = append(dst, '\n')
		case 'r':
			dst = append(dst, '\r')
		case 't':
			dst = append(dst, '\t')
		case 'u':
			r, _ := hex4(b, i+1)
			dst = append(dst, byte(r))
			i += 4
		default:
			dst = append(dst, b[i])
		}
	}
	return dst
}

// compareUTF16 orders two UTF-8 strings as RFC 8785 wants: by their UTF-16
// code units. That is byte order except where a code point at or above
// U+10000 (a surrogate pair, 0xD800 up) meets one in U+E000..U+FFFF, which
// UTF-16 puts after it and UTF-8 before.
func compareUTF16(a, b []byte) int {
	n := min(len(a), len(b))
	i := 0
	for i < n && a[i] == b[i] {
		i++
	}
	if i == n {
		switch {
		case len(a) < len(b):
			return -1
		case len(a) > len(b):
			return 1
		}
		return 0
	}
	if a[i] < utf8.RuneSelf && b[i] < utf8.RuneSelf {
		return cmpByte(a[i], b[i])
	}
	// Back up to the start of the code point the two differ in; the bytes
	// before i are shared, so it starts at the same place in both.
	for i > 0 && !utf8.RuneStart(a[i]) {
		i--
	}
	ra, _ := utf8.DecodeRune(a[i:])
	rb, _ := utf8.DecodeRune(b[i:])
	ua, ub := firstUnit(ra), firstUnit(rb)
	if ua != ub {
		if ua < ub {
			return -1
		}
		return 1
	}
	// Same high surrogate: the low ones order like the code points.
	if ra < rb {
		return -1
	}
	return 1
}

func cmpByte(a, b byte) int {
	if a < b {
		return -1
	}
	return 1
}

func firstUnit(r rune) rune {
	if r >= 0x10000 {
		return 0xD800 + (r-0x10000)>>10
	}
	return r
}
