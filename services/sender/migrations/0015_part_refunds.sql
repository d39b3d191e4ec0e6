-- A scheduled send that leaves some recipients off at its release owes their part of its
-- charge back ('refund_part'); one with none left owes the whole charge ('refund').
ALTER TABLE settlements DROP CONSTRAINT settlements_action_check;
ALTER TABLE settlements ADD CONSTRAINT settlements_action_check
    CHECK (action IN ('confirm', 'refund', 'refund_part'));
