package route

import (
	"fmt"
	"strings"
)

// Role is what part of a request a replica serves when prefill and
// decode are disaggregated: a prefill replica computes a prompt's KV and
// hands it over, a decode replica takes the KV and generates. The zero
// Role is RoleBoth, a whole replica (every replica of an aggregated
// deployment, and every replica whose router says nothing of its role,
// such as a router of an older version): it serves whole requests and
// either leg of a disaggregated one.
type Role uint8

// The roles.
const (
	RoleBoth    Role = 0
	RolePrefill Role = 1
	RoleDecode  Role = 2
	// maxRole is the highest role a router of this version knows.
	maxRole = RoleDecode
)

// Prefills reports whether a replica of role r may take a request's
// prefill leg.
func (r Role) Prefills() bool { return r == RoleBoth || r == RolePrefill }

// Decodes reports whether a replica of role r may take a request's
// decode leg.
func (r Role) Decodes() bool { return r == RoleBoth || r == RoleDecode }

// Valid reports whether r is a role this version knows (a decoder
// refuses others).
func (r Role) Valid() bool { return r <= maxRole }

// String is the role's name as flags, metrics and the debug JSON spell
// it: both, prefill or decode.
func (r Role) String() string {
	switch r {
	case RoleBoth:
		return "both"
	case RolePrefill:
		return "prefill"
	case RoleDecode:
		return "decode"
	}
	return fmt.Sprintf("role(%d)", uint8(r))
}

// ParseRole reads a role's name (case-insensitive): both, prefill or
// decode.
func ParseRole(s string) (Role, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "both":
		return RoleBoth, nil
	case "prefill":
		return RolePrefill, nil
	case "decode":
		return RoleDecode, nil
	}
	return RoleBoth, fmt.Errorf("role %q is not prefill, decode or both", s)
}
