#!/bin/sh
# A PgBouncer of the suite's own, in transaction pooling mode, in front of a
# PostgreSQL server, for the pass of the PostgreSQL tests through a pooler:
#
#   scripts/pgbouncer.sh start DIR PORT SERVER_URL   # prints the pooler's URL
#   scripts/pgbouncer.sh stop DIR
#
# DIR is a scratch folder of the caller's (its config, log and pid file);
# PORT one of the caller's; SERVER_URL the server as a superuser
# (postgres://postgres@127.0.0.1:5432/NAME). PgBouncer comes from Debian's
# package (installed as root when missing) and runs as the postgres OS user
# when started as root. It accepts any user the server knows (auth_user
# looks them up), so the roles a test run makes connect through it too.
# Nothing of the server is changed.
set -eu
ACTION=$1 DIR=$2
case "$ACTION" in
start)
    PORT=$3 SERVER=$4
    "$(dirname "$0")/debian-package.sh" /usr/sbin/pgbouncer pgbouncer "the PgBouncer pass"
    [ -x /usr/sbin/pgbouncer ] || { echo "no /usr/sbin/pgbouncer" >&2; exit 1; }
    # postgres://USER[:PASSWORD]@HOST:PORT/NAME
    rest=${SERVER#*://}
    user=${rest%%@*}
    user=${user%%:*}
    hostport=${rest#*@}
    hostport=${hostport%%/*}
    host=${hostport%%:*}
    server_port=${hostport#*:}
    [ "$server_port" = "$hostport" ] && server_port=5432
    name=${rest##*/}
    mkdir -p "$DIR"
    printf '"%s" ""\n' "$user" >"$DIR/users.txt"
    cat >"$DIR/pgbouncer.ini" <<EOF
[databases]
* = host=$host port=$server_port

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = $PORT
unix_socket_dir =
auth_type = trust
auth_file = $DIR/users.txt
auth_user = $user
pool_mode = transaction
max_client_conn = 500
default_pool_size = 10
server_idle_timeout = 10
ignore_startup_parameters = extra_float_digits
logfile = $DIR/pgbouncer.log
pidfile = $DIR/pgbouncer.pid
EOF
    if [ "$(id -u)" = 0 ]; then
        chown -R postgres "$DIR"
        su postgres -s /bin/sh -c "/usr/sbin/pgbouncer -d '$DIR/pgbouncer.ini'"
    else
        /usr/sbin/pgbouncer -d "$DIR/pgbouncer.ini"
    fi
    tries=0
    until python3 -c "import socket; socket.create_connection(('127.0.0.1', $PORT), 1)" 2>/dev/null; do
        tries=$((tries + 1))
        [ "$tries" -lt 100 ] || { echo "PgBouncer did not start; see $DIR/pgbouncer.log" >&2; exit 1; }
        sleep 0.1
    done
    echo "postgres://$user@127.0.0.1:$PORT/$name"
    ;;
stop)
    if [ -s "$DIR/pgbouncer.pid" ]; then
        kill "$(cat "$DIR/pgbouncer.pid")" 2>/dev/null || true
    fi
    ;;
*)
    echo "usage: $0 start DIR PORT SERVER_URL | stop DIR" >&2
    exit 2
    ;;
esac
