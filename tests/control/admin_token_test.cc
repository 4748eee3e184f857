// The admin token's file and its recovery (issue 18, item 10): control_plane.h's
// write_secret_file() and control.h's make_data_dir() and reset_admin_token().
#include <filesystem>
#include <fstream>
#include <string>

#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "auth/auth.h"
#include "control/control.h"
#include "control/control_plane.h"
#include "control/store.h"

namespace flotilla::control {
namespace {

using ::testing::HasSubstr;

class AdminTokenTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("flotilla-admin-token-" + std::to_string(::getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
    old_umask_ = ::umask(0);  // the modes below are the code's, not the umask's
  }
  void TearDown() override {
    ::umask(old_umask_);
    std::filesystem::permissions(dir_, std::filesystem::perms::owner_all);
    std::filesystem::remove_all(dir_);
  }

  static int mode_of(const std::filesystem::path& path) {
    struct stat info {};
    EXPECT_EQ(::stat(path.c_str(), &info), 0) << path;
    return static_cast<int>(info.st_mode & 0777);
  }
  static std::string read(const std::filesystem::path& path) {
    std::ifstream in(path);
    return std::string((std::istreambuf_iterator<char>(in)), {});
  }

  // A data directory with a state database holding the first admin token.
  std::string token_in_store() {
    EXPECT_TRUE(make_data_dir(dir_.string()).is_ok());
    auto store = Store::open((dir_ / "state.db").string());
    EXPECT_TRUE(store.is_ok());
    auto token = auth::generate_token("admin", {});
    EXPECT_TRUE(token.is_ok());
    EXPECT_TRUE((*store)->create_token(TokenRow{token->record, true, "first", 1}).is_ok());
    return token->token;
  }
  static bool valid(const std::filesystem::path& db, const std::string& token) {
    auto store = Store::open(db.string());
    auto rows = (*store)->list_tokens();
    std::vector<auth::TokenRecord> records;
    for (const TokenRow& row : *rows) {
      if (row.admin) {
        records.push_back(row.record);
      }
    }
    return auth::Authenticator(records).check("Bearer " + token, "") == auth::AuthResult::kAllowed;
  }

  std::filesystem::path dir_;
  mode_t old_umask_ = 0;
};

TEST_F(AdminTokenTest, TheDataDirectoryIsPrivate) {
  const std::filesystem::path nested = dir_ / "a" / "data";
  ASSERT_TRUE(make_data_dir(nested.string()).is_ok());
  EXPECT_EQ(mode_of(nested), 0700);
  ASSERT_TRUE(make_data_dir(nested.string()).is_ok());  // existing: fine
  std::ofstream(dir_ / "file") << "x";
  EXPECT_FALSE(make_data_dir((dir_ / "file").string()).is_ok());
}

TEST_F(AdminTokenTest, TheSecretFileIsCreatedMode0600) {
  ASSERT_TRUE(make_data_dir(dir_.string()).is_ok());
  const std::filesystem::path path = dir_ / "admin.token";
  ASSERT_TRUE(write_secret_file(path.string(), "flt_a_b\n", false).is_ok());
  EXPECT_EQ(mode_of(path), 0600);
  EXPECT_EQ(read(path), "flt_a_b\n");
  // Exclusive: an existing file is not overwritten unless asked to.
  EXPECT_FALSE(write_secret_file(path.string(), "other\n", false).is_ok());
  EXPECT_EQ(read(path), "flt_a_b\n");
  ASSERT_TRUE(write_secret_file(path.string(), "other\n", true).is_ok());
  EXPECT_EQ(read(path), "other\n");
  // Never through a symlink.
  std::filesystem::remove(path);
  std::filesystem::create_symlink(dir_ / "elsewhere", path);
  EXPECT_FALSE(write_secret_file(path.string(), "x\n", false).is_ok());
  EXPECT_FALSE(std::filesystem::exists(dir_ / "elsewhere"));
}

TEST_F(AdminTokenTest, ADirectoryInTheWayIsAnErrorAndStaysAsItWas) {
  ASSERT_TRUE(make_data_dir(dir_.string()).is_ok());
  std::filesystem::create_directory(dir_ / "admin.token");
  const Status status = write_secret_file((dir_ / "admin.token").string(), "x\n", true);
  EXPECT_EQ(status.code(), StatusCode::kUnavailable);
  EXPECT_THAT(status.message(), HasSubstr("admin.token"));
  EXPECT_TRUE(std::filesystem::is_directory(dir_ / "admin.token"));
}

// The way back in after admin.token is lost: a new token in the file and the row replaced; the
// old token stops working.
TEST_F(AdminTokenTest, ResetAdminReplacesTheRowAndWritesTheFile) {
  const std::string old_token = token_in_store();
  ASSERT_TRUE(valid(dir_ / "state.db", old_token));
  Result<std::string> reset = reset_admin_token(dir_.string());
  ASSERT_TRUE(reset.is_ok()) << reset.status().message();
  EXPECT_EQ(read(dir_ / "admin.token"), *reset + "\n");
  EXPECT_EQ(mode_of(dir_ / "admin.token"), 0600);
  EXPECT_TRUE(valid(dir_ / "state.db", *reset));
  EXPECT_FALSE(valid(dir_ / "state.db", old_token));
  EXPECT_FALSE(std::filesystem::exists(dir_ / "admin.token.new"));
}

TEST_F(AdminTokenTest, ResetAdminRefusesADataDirectoryInUseAndChangesNothing) {
  const std::string old_token = token_in_store();
  std::ofstream(dir_ / "admin.token") << old_token << "\n";
  const int lock = ::open((dir_ / "lock").c_str(), O_RDWR | O_CREAT, 0600);
  ASSERT_GE(lock, 0);
  ASSERT_EQ(::flock(lock, LOCK_EX), 0);  // as a running flotilla up holds it
  Result<std::string> reset = reset_admin_token(dir_.string());
  ::close(lock);
  ASSERT_FALSE(reset.is_ok());
  EXPECT_THAT(reset.status().message(), HasSubstr("in use by a running flotilla up"));
  EXPECT_EQ(read(dir_ / "admin.token"), old_token + "\n");
  EXPECT_TRUE(valid(dir_ / "state.db", old_token));
  // No database: nothing to reset.
  EXPECT_THAT(reset_admin_token((dir_ / "nothing").string()).status().message(),
              HasSubstr("no state database"));
}

// A file that cannot be written leaves the row as it was (the admin keeps the old token).
TEST_F(AdminTokenTest, ResetAdminThatCannotWriteTheFileChangesNothing) {
  if (::geteuid() == 0) {
    // root writes into a read-only directory: make the new file's name a directory instead.
    const std::string old_token = token_in_store();
    std::filesystem::create_directory(dir_ / "admin.token.new");
    ASSERT_FALSE(reset_admin_token(dir_.string()).is_ok());
    EXPECT_TRUE(valid(dir_ / "state.db", old_token));
    return;
  }
  const std::string old_token = token_in_store();
  std::filesystem::permissions(
      dir_, std::filesystem::perms::owner_read | std::filesystem::perms::owner_exec);
  ASSERT_FALSE(reset_admin_token(dir_.string()).is_ok());
  std::filesystem::permissions(dir_, std::filesystem::perms::owner_all);
  EXPECT_TRUE(valid(dir_ / "state.db", old_token));
}

}  // namespace
}  // namespace flotilla::control
