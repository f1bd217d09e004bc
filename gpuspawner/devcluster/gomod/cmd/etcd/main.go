// Command etcd is etcd's own server entry point, built at the version
// Kubernetes pins, so that the devcluster needs no downloaded binary.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
