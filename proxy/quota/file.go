package quota

import (
	"bufio"
	"fmt"
	"io"
	"strconv"
	"strings"
)

// DefaultName names the default budget in a budgets file.
const DefaultName = "*"

// maxFileTenants bounds the overrides a budgets file may hold.
const maxFileTenants = 100000

// ParseFile reads a budgets file: one tenant a line, its name then its
// input and output tokens per window (0 or - for no limit of that kind);
// the name * sets the default; # starts a comment. A tenant's name is
// what identifies it to the router (its API key, its X-Kvmesh-Tenant
// value, or its address), and labels its metrics.
//
//	# tenant        input/window  output/window
//	*               200000        50000
//	team-research   2000000       400000
//	batch-jobs      -             20000
func ParseFile(r io.Reader) (def *Limit, tenants map[string]Limit, err error) {
	tenants = map[string]Limit{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 4096), 64<<10)
	for n := 1; sc.Scan(); n++ {
		line, _, _ := strings.Cut(sc.Text(), "#")
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		if len(f) != 3 {
			return nil, nil, fmt.Errorf("budgets line %d: want a tenant, input and output tokens, got %d fields", n, len(f))
		}
		var l Limit
		if l.Input, err = parseTokens(f[1]); err == nil {
			l.Output, err = parseTokens(f[2])
		}
		if err != nil {
			return nil, nil, fmt.Errorf("budgets line %d: %w", n, err)
		}
		if f[0] == DefaultName {
			if def != nil {
				return nil, nil, fmt.Errorf("budgets line %d: a second default", n)
			}
			def = &l
			continue
		}
		if _, dup := tenants[f[0]]; dup {
			return nil, nil, fmt.Errorf("budgets line %d: tenant %q twice", n, f[0])
		}
		if len(tenants) >= maxFileTenants {
			return nil, nil, fmt.Errorf("budgets line %d: more than %d tenants", n, maxFileTenants)
		}
		tenants[f[0]] = l
	}
	if err := sc.Err(); err != nil {
		return nil, nil, fmt.Errorf("budgets: %w", err)
	}
	return def, tenants, nil
}

// parseTokens reads a count of tokens: a non-negative integer, or - for
// none (0).
func parseTokens(s string) (int64, error) {
	if s == "-" {
		return 0, nil
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n < 0 || n > maxCount {
		return 0, fmt.Errorf("%q is not a count of tokens (0 to %d, or -)", s, int64(maxCount))
	}
	return n, nil
}
