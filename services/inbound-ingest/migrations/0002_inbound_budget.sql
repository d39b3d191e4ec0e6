-- Each workspace's inbound byte budget (GCRA): the moment, in Unix seconds by the
-- database's clock, by which what it has received is paid off.
CREATE TABLE inbound_budget (
    workspace_id uuid PRIMARY KEY,
    tat double precision NOT NULL
);
