// Command redisfleet starts the Redis that ./xcaddy.sh test shares with all
// test packages: a cluster of 3 masters and 3 replicas and a standalone
// server, on loopback. It writes their addresses as shell variable
// assignments to the file named by -env, then runs until SIGTERM or
// SIGINT, and stops every redis-server it started, by PID.
package main

import (
	"flag"
	"fmt"
	"log"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/caddy-ratelimit/caddy-rate-limit/internal/redistest"
)

func main() {
	envFile := flag.String("env", "", "file to write the addresses to")
	dir := flag.String("dir", "", "directory for the servers' files")
	flag.Parse()
	if *envFile == "" || *dir == "" {
		log.Fatal("usage: redisfleet -env <file> -dir <dir>")
	}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)

	cluster, err := redistest.StartCluster(*dir, 3, 1)
	if err != nil {
		log.Fatal(err)
	}
	defer cluster.Stop()
	standalone, err := redistest.StartServer(*dir)
	if err != nil {
		cluster.Stop()
		log.Fatal(err)
	}
	defer standalone.Stop()

	env := fmt.Sprintf("export %s=%s\nexport %s=%s\n", redistest.EnvCluster, strings.Join(cluster.Addrs(), ","),
		redistest.EnvStandalone, standalone.Addr)
	if err := os.WriteFile(*envFile+".tmp", []byte(env), 0o600); err == nil {
		err = os.Rename(*envFile+".tmp", *envFile)
	}
	if err != nil {
		log.Print(err)
		return
	}
	log.Printf("redis cluster %s, standalone %s", strings.Join(cluster.Addrs(), ","), standalone.Addr)
	<-sig
}
