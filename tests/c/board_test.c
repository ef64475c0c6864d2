/* The priority board (board.c) and the priority parsers it is joined with.
 * Built with AddressSanitizer and UBSan by tests/test_core.py.  Prints
 * "N passed, N failed". */
#include "core_fixture.h"
#include "vgpulimit/board.h"

/* The priority board (board.c): rows taken, changed and left by setters;
 * a row whose holder died is taken again; a board that is not one refused. */
static void test_board(const char *dir)
{
    uint32_t p;
    CHECK(vgl_parse_priority(" High ", &p) == 0 && p == VGL_PRIORITY_HIGH, "High");
    CHECK(vgl_parse_priority("urgent", &p) == -EINVAL, "urgent");
    CHECK(vgl_parse_hami_priority("0", &p) == 0 && p == VGL_PRIORITY_HIGH, "HAMi 0");
    CHECK(vgl_parse_hami_priority("1", &p) == 0 && p == VGL_PRIORITY_LOW, "HAMi 1");
    CHECK(vgl_parse_hami_priority("2", &p) == -EINVAL, "HAMi 2");
    CHECK(vgl_priority_rank(VGL_PRIORITY_HIGH) > vgl_priority_rank(VGL_PRIORITY_NORMAL) &&
          vgl_priority_rank(VGL_PRIORITY_NORMAL) > vgl_priority_rank(VGL_PRIORITY_LOW), "ranks");

    char path[512], beacon[600];
    snprintf(path, sizeof path, "%s/priority.board", dir);
    uint64_t key[2];
    uint32_t row[2];
    /* Rows are the containers' by their region files: here made-up ones. */
    CHECK(vgl_board_join(path, VGL_PRIORITY_HIGH, 0, -1, 7, 100, &key[0], &row[0]) == 0, "join");
    CHECK(vgl_board_join(path, VGL_PRIORITY_LOW, 0, -1, 7, 101, &key[1], &row[1]) == 0 && row[1] != row[0],
          "join again");
    CHECK(vgl_board_set(path, 7, 101, VGL_PRIORITY_NORMAL) == 0, "set");
    CHECK(vgl_board_set(path, 8, 101, VGL_PRIORITY_HIGH) == -ESRCH, "set for a file with no row");
    CHECK(vgl_board_join(path, 7, 0, -1, 7, 102, &key[1], &row[1]) == -EINVAL, "a priority that is none");
    CHECK(vgl_board_join(path, VGL_PRIORITY_LOW, 0, -1, 7, 0, &key[1], &row[1]) == -EINVAL, "no region file");
    /* A file that joins again (its inode reused, the row never left): one row. */
    uint64_t again_key, found_key;
    uint32_t again_row;
    CHECK(vgl_board_join(path, VGL_PRIORITY_LOW, 0, -1, 7, 103, &again_key, &again_row) == 0, "a third");
    CHECK(vgl_board_join(path, VGL_PRIORITY_HIGH, 0, -1, 7, 103, &again_key, &again_row) == 0, "it again");
    struct vgl_board board;
    int fd = open(path, O_RDONLY);
    CHECK(fd >= 0 && read(fd, &board, sizeof board) == (ssize_t)sizeof board, "read the board");
    if (fd >= 0)
        close(fd);
    CHECK(vgl_board_check(&board, sizeof board) == 0, "a board");
    CHECK(board.row[row[1]].priority == VGL_PRIORITY_NORMAL, "the row was set");
    CHECK(vgl_board_find(&board, 7, 101, &found_key) == (int)row[1] && found_key == key[1], "found by its file");
    CHECK(vgl_board_find(&board, 8, 101, NULL) == -ESRCH, "another device's file has none");
    int rows_of_103 = 0;
    for (int i = 0; i < VGL_BOARD_ROWS; i++)
        rows_of_103 += board.row[i].key && board.row[i].region_ino == 103;
    CHECK(rows_of_103 == 1 && board.row[again_row].key == again_key &&
          board.row[again_row].priority == VGL_PRIORITY_HIGH, "one row per file, the last joined");
    snprintf(beacon, sizeof beacon, "%s/%s", dir, board.row[row[0]].beacon);
    struct vgl_beacon b;
    fd = open(beacon, O_RDONLY);
    CHECK(fd >= 0 && read(fd, &b, sizeof b) == (ssize_t)sizeof b && vgl_beacon_check(&b, sizeof b) == 0,
          "its beacon");
    if (fd >= 0)
        close(fd);
    CHECK(vgl_board_check(&board, sizeof board - 1) == -EBADF, "a short board");
    struct vgl_board garbled = board;
    snprintf(garbled.row[row[0]].beacon, sizeof garbled.row[row[0]].beacon, "../../etc/passwd");
    CHECK(vgl_board_check(&garbled, sizeof garbled) == -EBADMSG, "a beacon out of the directory");
    CHECK(vgl_beacon_check(&board, sizeof board) == -EPROTO, "a board is no beacon");

    CHECK(vgl_board_leave(path, row[0], key[0]) == 0 && access(beacon, F_OK) != 0, "leave");
    CHECK(vgl_board_leave(path, row[1], key[1]) == 0, "leave the other");
    CHECK(vgl_board_leave(path, again_row, again_key) == 0, "leave the third");

    /* A supervisor that died without leaving: its row is taken by the next. */
    pid_t child = fork_child();
    if (child == 0)
        _exit(0);
    uint64_t dead_key;
    uint32_t dead_row, next_row;
    CHECK(vgl_board_join(path, VGL_PRIORITY_LOW, child, -1, 7, 200, &dead_key, &dead_row) == 0,
          "join for a child");
    waitpid(child, NULL, 0);
    int taken = 0;
    for (int i = 0; i < VGL_BOARD_ROWS; i++) {
        uint64_t k;
        if (vgl_board_join(path, VGL_PRIORITY_LOW, 0, -1, 7, 300 + (uint64_t)i, &k, &next_row) != 0)
            break;
        taken++;
        if (next_row == dead_row)
            break;
    }
    CHECK(next_row == dead_row, "the dead holder's row was taken again (after %d)", taken);
    uint64_t k;
    while (vgl_board_join(path, VGL_PRIORITY_LOW, 0, -1, 7, 400 + (uint64_t)taken, &k, &next_row) == 0)
        taken++;
    CHECK(vgl_board_join(path, VGL_PRIORITY_LOW, 0, -1, 7, 999, &k, &next_row) == -ENOSPC, "a full board");
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: board_test SCRATCH_DIR [board]...\n");
        return 2;
    }
    vgl_log_level = VGL_LOG_ERROR;
    if (wanted(argc, argv, "board"))
        test_board(argv[1]);
    return check_summary();
}
