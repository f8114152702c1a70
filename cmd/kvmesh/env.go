package main

import (
	"flag"
	"fmt"
	"strings"
)

// multiValue is a flag.Value that takes a comma-separated list from the
// environment.
type multiValue interface{ isList() }

// applyEnv sets every flag of fs not given on the command line from
// KVMESH_<FLAG> (upper case, dashes as underscores), so every subcommand
// can be configured by environment as well as by flags. Repeatable flags
// (multiValue) take a comma-separated list. The command line wins.
func applyEnv(fs *flag.FlagSet, getenv func(string) (string, bool)) error {
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	var err error
	fs.VisitAll(func(f *flag.Flag) {
		if given[f.Name] || err != nil {
			return
		}
		key := "KVMESH_" + strings.ToUpper(strings.ReplaceAll(f.Name, "-", "_"))
		v, ok := getenv(key)
		if !ok || v == "" {
			return
		}
		vals := []string{v}
		if _, isList := f.Value.(multiValue); isList {
			vals = strings.Split(v, ",")
		}
		for _, s := range vals {
			if e := f.Value.Set(strings.TrimSpace(s)); e != nil {
				err = fmt.Errorf("%s: %s=%q: %w", fs.Name(), key, v, e)
				return
			}
		}
	})
	return err
}
