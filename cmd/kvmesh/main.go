// Command kvmesh is the one kvmesh binary: a cache-aware router for
// OpenAI-compatible LLM replicas, and the tools that measure it.
//
//	kvmesh router       serve the OpenAI API and join the mesh
//	kvmesh sim          trace-driven simulation of routing policies
//	kvmesh replica-sim  a vLLM-like engine for machines without a GPU
//	kvmesh bench        replay a trace against real endpoints
//	kvmesh demo         a local mesh against standard load balancers
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"sort"
	"syscall"
)

// command is one subcommand: it parses its own flags from args and runs
// until done or until ctx is cancelled.
type command struct {
	summary string
	run     func(ctx context.Context, args []string, stdout, stderr io.Writer) error
}

func commands() map[string]command {
	return map[string]command{
		"router":      {"serve the OpenAI API, front replicas and join the mesh", runRouter},
		"sim":         {"simulate routing policies on a trace in virtual time", runSim},
		"replica-sim": {"run a simulated vLLM-like replica (no GPU needed)", runReplicaSim},
		"bench":       {"replay a trace against OpenAI endpoints and measure TTFT and cache hits", runBench},
		"demo":        {"start a local mesh and compare it with standard load balancers", runDemo},
		"scale":       {"run many routers in one process and measure gossip, visibility and decisions", runScale},
	}
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := dispatch(ctx, os.Args[1:], os.Stdout, os.Stderr); err != nil {
		if !errors.Is(err, flag.ErrHelp) {
			fmt.Fprintln(os.Stderr, "kvmesh:", err)
		}
		os.Exit(2)
	}
}

func dispatch(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	cmds := commands()
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		usage(stderr, cmds)
		if len(args) == 0 {
			return errors.New("no subcommand")
		}
		return nil
	}
	c, ok := cmds[args[0]]
	if !ok {
		usage(stderr, cmds)
		return fmt.Errorf("unknown subcommand %q", args[0])
	}
	return c.run(ctx, args[1:], stdout, stderr)
}

func usage(w io.Writer, cmds map[string]command) {
	fmt.Fprintln(w, "usage: kvmesh <subcommand> [flags]\n\nsubcommands:")
	names := make([]string, 0, len(cmds))
	for n := range cmds {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		fmt.Fprintf(w, "  %-12s %s\n", n, cmds[n].summary)
	}
	fmt.Fprintln(w, "\nRun 'kvmesh <subcommand> --help' for its flags.")
}
