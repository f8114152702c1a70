package main

import (
	"errors"
	"flag"
	"fmt"
	"strings"
)

// listFlag is a repeatable flag whose values may also be comma-separated
// lists, on the command line and in the environment alike.
type listFlag []string

func (l *listFlag) String() string { return strings.Join(*l, ",") }

// Set implements flag.Value.
func (l *listFlag) Set(v string) error {
	n := len(*l)
	for _, p := range strings.Split(v, ",") {
		if p = strings.TrimSpace(p); p != "" {
			*l = append(*l, p)
		}
	}
	if len(*l) == n {
		return errors.New("empty value")
	}
	return nil
}

// applyEnv sets every flag of fs not given on the command line from
// KVMESH_<FLAG> (upper case, dashes as underscores), so a subcommand can
// be configured by environment as well as by flags. The command line wins.
func applyEnv(fs *flag.FlagSet, getenv func(string) (string, bool)) error {
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	var err error
	fs.VisitAll(func(f *flag.Flag) {
		if given[f.Name] || err != nil {
			return
		}
		key := "KVMESH_" + strings.ToUpper(strings.ReplaceAll(f.Name, "-", "_"))
		if v, ok := getenv(key); ok && v != "" {
			if e := f.Value.Set(v); e != nil {
				err = fmt.Errorf("%s: %s=%q: %w", fs.Name(), key, v, e)
			}
		}
	})
	return err
}
