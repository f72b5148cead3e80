package canon

import (
	"math"
	"strconv"
)

// number reads the number at src[i] and appends it in the profile's form.
func (s *state) number(i int) (int, error) {
	src := s.src
	start := i
	bad := func(why string) (int, error) { return start, fail(ErrInvalidNumber, start, "%s", why) }
	neg := false
	if src[i] == '-' {
		neg = true
		i++
	}
	digits := func() int {
		j := i
		for j < len(src) && src[j] >= '0' && src[j] <= '9' {
			j++
		}
		return j
	}
	if i >= len(src) || src[i] < '0' || src[i] > '9' {
		return bad("a number must start with a digit or a minus sign (NaN and Infinity are not JSON)")
	}
	intStart := i
	if src[i] == '0' {
		i++
	} else {
		i = digits()
	}
	intEnd, fracStart, fracEnd := i, i, i
	if i < len(src) && src[i] == '.' {
		i++
		fracStart = i
		if i = digits(); i == fracStart {
			return bad("a decimal point must be followed by a digit")
		}
		fracEnd = i
	}
	var exp int64
	if i < len(src) && (src[i] == 'e' || src[i] == 'E') {
		i++
		expNeg := false
		if i < len(src) && (src[i] == '+' || src[i] == '-') {
			expNeg = src[i] == '-'
			i++
		}
		e := i
		if i = digits(); i == e {
			return bad("an exponent must have a digit")
		}
		// Saturate: anything this large is out of range either way, and
		// the input length keeps the later arithmetic far from overflow.
		for _, c := range src[e:i] {
			if exp < 1<<40 {
				exp = exp*10 + int64(c-'0')
			}
		}
		if expNeg {
			exp = -exp
		}
	}
	if i < len(src) {
		switch c := src[i]; {
		case c >= '0' && c <= '9':
			return bad("leading zeros are not allowed")
		case c == '.' || c == 'e' || c == 'E' || c == '+' || c == '-' || c == '_' ||
			c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z':
			return bad("malformed number")
		}
	}
	if s.jcs {
		return i, s.double(start, i)
	}
	return i, s.exact(start, neg, src[intStart:intEnd], src[fracStart:fracEnd], exp)
}

// exact prints the decimal value intPart.frac × 10^exp as is.
func (s *state) exact(start int, neg bool, intPart, frac []byte, exp int64) error {
	d := append(append(s.scratch[:0], intPart...), frac...)
	s.scratch = d[:0]
	lead := 0
	for lead < len(d) && d[lead] == '0' {
		lead++
	}
	d = d[lead:]
	if len(d) == 0 {
		s.out = append(s.out, '0') // -0, 0.000 and 0e5 are all zero
		return nil
	}
	trail := 0
	for d[len(d)-1-trail] == '0' {
		trail++
	}
	d = d[:len(d)-trail]
	// value = 0.d × 10^n
	n := int64(len(d)) + exp - int64(len(frac)) + int64(trail)
	if n-1 < MinExponent || n-1 > MaxExponent {
		return fail(ErrNumberOutOfRange, start, "exponent %d is outside [%d, %d]", n-1, MinExponent, MaxExponent)
	}
	s.out = appendES(s.out, neg, d, int(n))
	return nil
}

// double prints src[start:end] as RFC 8785 does: through the nearest IEEE
// double.
func (s *state) double(start, end int) error {
	f, err := strconv.ParseFloat(string(s.src[start:end]), 64)
	if err != nil || math.IsInf(f, 0) {
		return fail(ErrNumberOutOfRange, start, "number does not fit in an IEEE 754 double")
	}
	if f == 0 {
		s.out = append(s.out, '0')
		return nil
	}
	// Shortest round-trip digits, as "d.ddde±x", then laid out again.
	b := strconv.AppendFloat(s.scratch[:0], math.Abs(f), 'e', -1, 64)
	s.scratch = b[:0]
	e := len(b) - 1
	for b[e] != 'e' {
		e--
	}
	x, _ := strconv.Atoi(string(b[e+1:]))
	d := b[:e]
	if len(d) > 1 {
		d = append(d[:1], d[2:]...) // drop the decimal point
	}
	s.out = appendES(s.out, f < 0, d, x+1)
	return nil
}

// appendES lays out the value 0.d × 10^n (d without leading or trailing
// zeros) the way ECMAScript's Number.prototype.toString does: plain digits
// while the decimal point stays within 21 places, exponent notation beyond.
func appendES(out []byte, neg bool, d []byte, n int) []byte {
	if neg {
		out = append(out, '-')
	}
	k := len(d)
	switch {
	case k <= n && n <= 21:
		out = append(out, d...)
		for range n - k {
			out = append(out, '0')
		}
	case 0 < n && n <= 21:
		out = append(out, d[:n]...)
		out = append(out, '.')
		out = append(out, d[n:]...)
	case -6 < n && n <= 0:
		out = append(out, '0', '.')
		for range -n {
			out = append(out, '0')
		}
		out = append(out, d...)
	default:
		out = append(out, d[0])
		if k > 1 {
			out = append(out, '.')
			out = append(out, d[1:]...)
		}
		out = append(out, 'e')
		if n-1 < 0 {
			out = append(out, '-')
			out = strconv.AppendInt(out, int64(1-n), 10)
		} else {
			out = append(out, '+')
			out = strconv.AppendInt(out, int64(n-1), 10)
		}
	}
	return out
}
